package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// KernelProto marks the kernel routes the agent owns in the node's main table (`ip route show
// proto 78`): it changes and removes those and no other, and adds a route only where the table
// has none to that network.
const KernelProto = 78

// KernelRoutes is the node's own routing table, as far as the agent touches it.
type KernelRoutes interface {
	// Owned lists the routes of protocol KernelProto in the main table: network -> gateway.
	Owned() (map[string]string, error)
	// Add adds the route to net through via; it fails where the table has a route to net
	// already (someone else's).
	Add(net, via string) error
	// Change points the agent's own route to net through via.
	Change(net, via string) error
	// Delete removes the agent's route to net through via.
	Delete(net, via string) error
}

// ReconcileKernel makes the node's kernel routes that the agent owns equal to want (network ->
// the node that has it), as flannel's host-gw keeps them: the node's own traffic to the other
// nodes' pods goes to those nodes on the link, and a node whose reverse-path filter is strict
// (rp_filter 1) answers the daemons' ARP requests, which carry a pod's address as sender. Only
// IPv4 networks inside cluster are added, and never over a route that is not the agent's.
// Returns the changes made and the routes refused (each with the reason); the error says the
// table could not be read.
func ReconcileKernel(k KernelRoutes, want map[string]string, cluster netip.Prefix) (changes, refused []string, err error) {
	have, err := k.Owned()
	if err != nil {
		return nil, nil, fmt.Errorf("the node's kernel routes: %w", err)
	}
	for _, net := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[net]; ok {
			continue // kept, or changed below
		}
		if err := k.Delete(net, have[net]); err != nil {
			refused = append(refused, fmt.Sprintf("removing kernel route %s via %s: %v", net, have[net], err))
			continue
		}
		changes = append(changes, fmt.Sprintf("kernel route removed: %s via %s", net, have[net]))
	}
	for _, net := range slices.Sorted(maps.Keys(want)) {
		via := want[net]
		old, ours := have[net]
		if ours && old == via {
			continue
		}
		p, perr := netip.ParsePrefix(net)
		a, aerr := netip.ParseAddr(via)
		if perr != nil || aerr != nil || !p.Addr().Is4() || !a.Is4() || !cluster.Contains(p.Addr()) || p.Bits() < cluster.Bits() {
			refused = append(refused, fmt.Sprintf("kernel route %s via %s: not an IPv4 network inside %s through an IPv4 address", net, via, cluster))
			continue
		}
		if ours {
			if err := k.Change(net, via); err != nil {
				refused = append(refused, fmt.Sprintf("kernel route %s via %s: %v", net, via, err))
				continue
			}
			changes = append(changes, fmt.Sprintf("kernel route changed: %s via %s (was via %s)", net, via, old))
			continue
		}
		if err := k.Add(net, via); err != nil {
			refused = append(refused, fmt.Sprintf("kernel route %s via %s: %v", net, via, err))
			continue
		}
		changes = append(changes, fmt.Sprintf("kernel route added: %s via %s", net, via))
	}
	return changes, refused, nil
}
