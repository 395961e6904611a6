package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
)

// KernelProto marks the kernel routes the agent owns in the node's main table (`ip route show
// proto 78`): it adds, changes and removes those and no other.
const KernelProto = 78

// KernelRoutes is the node's own routing table, as far as the agent touches it.
type KernelRoutes interface {
	// Owned lists the routes of protocol KernelProto in the main table: network -> gateway.
	Owned() (map[string]string, error)
	// Replace adds the route to net through via, or changes the one there.
	Replace(net, via string) error
	// Delete removes the agent's route to net through via.
	Delete(net, via string) error
}

// ReconcileKernel makes the node's kernel routes that the agent owns equal to want (network ->
// the node that has it), as flannel's host-gw keeps them: the node's own traffic to the other
// nodes' pods goes to those nodes on the link, and a node whose reverse-path filter is strict
// (rp_filter 1) answers the daemons' ARP requests, which carry a pod's address as sender. Only
// IPv4 networks inside cluster are added. Returns the changes as lines; every change is tried,
// the errors joined.
func ReconcileKernel(k KernelRoutes, want map[string]string, cluster netip.Prefix) ([]string, error) {
	have, err := k.Owned()
	if err != nil {
		return nil, fmt.Errorf("the node's kernel routes: %w", err)
	}
	var lines []string
	var errs []error
	for _, net := range sortedKeys(have) {
		if w, ok := want[net]; ok && w == have[net] {
			continue
		}
		if err := k.Delete(net, have[net]); err != nil {
			errs = append(errs, fmt.Errorf("removing kernel route %s via %s: %w", net, have[net], err))
			continue
		}
		lines = append(lines, fmt.Sprintf("kernel route removed: %s via %s", net, have[net]))
	}
	for _, net := range sortedKeys(want) {
		via := want[net]
		if have[net] == via {
			continue
		}
		p, err := netip.ParsePrefix(net)
		a, aerr := netip.ParseAddr(via)
		if err != nil || aerr != nil || !p.Addr().Is4() || !a.Is4() || !cluster.Contains(p.Addr()) || p.Bits() < cluster.Bits() {
			errs = append(errs, fmt.Errorf("kernel route %s via %s: not an IPv4 network inside %s through an IPv4 address", net, via, cluster))
			continue
		}
		if err := k.Replace(net, via); err != nil {
			errs = append(errs, fmt.Errorf("kernel route %s via %s: %w", net, via, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("kernel route added: %s via %s", net, via))
	}
	return lines, errors.Join(errs...)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
