// Package agent keeps a node's DockNet routes equal to the cluster: every other node's pod
// network is reached through that node's address on the link the daemons drive (flannel's
// host-gw, Calico without BGP). It reads the nodes from the Kubernetes API (Node objects:
// spec.podCIDRs and the InternalIP address, through a client-go informer) or from a file, and
// programs the daemon through its control socket (`route_add`, `route_rm`, `route_ls`).
//
// The agent owns the routes inside the cluster's pod network (--cluster-cidr) and nothing
// else: routes an operator added outside it are left alone. What it reads is checked: a node
// without an IPv4 InternalIP, a pod network outside the cluster's or with host bits set, and a
// second node claiming a pod network already claimed are skipped and logged, never trusted.
//
// With the Kubernetes API it also keeps the daemon's services equal to the cluster's ClusterIP
// Services (services.go): one daemon service per IPv4 ClusterIP and TCP or UDP port, its
// backends the endpoints of the Service's EndpointSlices this node's pods reach (Nearby),
// through `service_set`, `service_rm` and `service_ls`. It owns the services named `k8s.*` and no others.
package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"

	"docknet/cni/internal/daemon"
)

// Node is what the agent needs of a node.
type Node struct {
	Name     string   `json:"name"`
	Address  string   `json:"address"`
	PodCIDRs []string `json:"podCIDRs"`
}

// Route is one route as the daemon lists it.
type Route = daemon.Route

// MaxNodes bounds the nodes the agent takes from its source (the daemon holds at most 4096
// routes).
const MaxNodes = 4096

// Desired computes the routes node self needs: every other node's IPv4 pod network through
// that node's address, each inside cluster. It returns them by network, and a line for each
// node or network skipped.
func Desired(self string, nodes []Node, cluster netip.Prefix) (map[string]string, []string) {
	want := map[string]string{}
	var skipped []string
	sorted := append([]Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	if len(sorted) > MaxNodes {
		skipped = append(skipped, fmt.Sprintf("%d nodes: only the first %d (by name) are routed", len(sorted), MaxNodes))
		sorted = sorted[:MaxNodes]
	}
	var mine []netip.Prefix
	found := false
	for _, n := range sorted {
		if n.Name != self {
			continue
		}
		found = true
		for _, c := range n.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is4() {
				mine = append(mine, p.Masked())
			}
		}
	}
	if !found && len(sorted) > 0 {
		skipped = append(skipped, fmt.Sprintf("this node %q is not among the nodes: is --node-name right?", self))
	}
	// pod networks taken so far (this node's first), and by whom
	taken := map[netip.Prefix]string{}
	for _, p := range mine {
		taken[p] = self
	}
	for _, n := range sorted {
		if n.Name == self {
			continue
		}
		addr, err := netip.ParseAddr(n.Address)
		if err != nil || !nextHop(addr) {
			skipped = append(skipped, fmt.Sprintf("node %q: no IPv4 address to route through (%q)", n.Name, n.Address))
			continue
		}
		if cluster.Contains(addr) {
			skipped = append(skipped, fmt.Sprintf("node %q: its address %s lies inside the cluster's pod network %s", n.Name, addr, cluster))
			continue
		}
		for _, c := range n.PodCIDRs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				skipped = append(skipped, fmt.Sprintf("node %q: pod network %q does not parse", n.Name, c))
				continue
			}
			if !p.Addr().Is4() {
				continue // IPv6 does not go to the wire
			}
			if p.Masked() != p {
				skipped = append(skipped, fmt.Sprintf("node %q: pod network %s has host bits set", n.Name, p))
				continue
			}
			if !cluster.Contains(p.Addr()) || p.Bits() <= cluster.Bits() {
				skipped = append(skipped, fmt.Sprintf("node %q: pod network %s is not a part of the cluster's %s", n.Name, p, cluster))
				continue
			}
			if q, who := overlapping(p, taken); q.IsValid() {
				skipped = append(skipped, fmt.Sprintf("node %q: pod network %s overlaps node %q's %s", n.Name, p, who, q))
				continue
			}
			taken[p] = n.Name
			want[p.String()] = addr.String()
		}
	}
	return want, skipped
}

// overlapping returns a network of taken that overlaps p, and whose it is.
func overlapping(p netip.Prefix, taken map[netip.Prefix]string) (netip.Prefix, string) {
	var best netip.Prefix
	for q := range taken {
		// the smallest such network, so the message does not depend on map order
		if p.Overlaps(q) && (!best.IsValid() || q.Addr().Less(best.Addr()) || (q.Addr() == best.Addr() && q.Bits() < best.Bits())) {
			best = q
		}
	}
	if best.IsValid() {
		return best, taken[best]
	}
	return netip.Prefix{}, ""
}

// nextHop says whether the daemon takes a as a next hop: a unicast IPv4 address (not 0/8,
// loopback, link-local multicast, multicast, 240/4 or the broadcast address).
func nextHop(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	b := a.As4()
	return b[0] != 0 && b[0] != 127 && b[0] < 224
}

// OwnPodNetwork is the IPv4 pod network node n hands addresses out of: its first IPv4
// podCIDR, which must have no host bits set, lie inside cluster (smaller than it) and hold at
// least 4 addresses. Otherwise the reason.
func OwnPodNetwork(n Node, cluster netip.Prefix) (netip.Prefix, string) {
	for _, c := range n.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		if p.Masked() != p || !cluster.Contains(p.Addr()) || p.Bits() <= cluster.Bits() || p.Bits() > 30 {
			return netip.Prefix{}, fmt.Sprintf("node %s's pod network %s is not a network of 4 or more addresses inside %s", n.Name, p, cluster)
		}
		return p, ""
	}
	return netip.Prefix{}, fmt.Sprintf("node %s has no IPv4 pod network yet", n.Name)
}

// Daemon is what the agent asks of the DockNet daemon (*daemon.Client is one).
type Daemon interface {
	RouteLs() ([]Route, error)
	RouteAdd(net, via string, vxlan *uint32) error
	RouteRm(net string) error
}

// Change is one change Reconcile made.
type Change struct {
	Op    string  `json:"op"` // "add" or "rm"
	Net   string  `json:"net"`
	Via   string  `json:"via"`
	Vxlan *uint32 `json:"vxlan,omitempty"`
}

// String is the change as the agent logs it.
func (c Change) String() string {
	s := fmt.Sprintf("route %s %s via %s", c.Op, c.Net, c.Via)
	if c.Vxlan != nil {
		s += fmt.Sprintf(" vxlan %d", *c.Vxlan)
	}
	return s
}

func sameVni(a, b *uint32) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// Reconcile makes the daemon's routes inside cluster equal to want, each through a VXLAN
// tunnel with identifier *vxlan when vxlan is not nil (else on the link): removes the ones not
// wanted (or through another next hop or tunnel), then adds the missing ones. Routes outside cluster are
// not touched. A route the daemon refuses does not stop the others: it is returned among the
// refusals (and tried again at the next pass). The error is for a daemon that could not be
// asked at all.
func Reconcile(d Daemon, want map[string]string, cluster netip.Prefix, vxlan *uint32) (done []Change, refused []string, err error) {
	have, err := d.RouteLs()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the daemon's routes: %w", err)
	}
	current := map[string]string{}
	for _, r := range have {
		p, err := netip.ParsePrefix(r.Net)
		if err != nil || !cluster.Contains(p.Addr()) || p.Bits() < cluster.Bits() {
			continue // not the agent's
		}
		if via, ok := want[r.Net]; ok && via == r.Via && sameVni(r.Vxlan, vxlan) {
			current[r.Net] = r.Via
			continue
		}
		if err := d.RouteRm(r.Net); err != nil {
			refused = append(refused, fmt.Sprintf("removing the route to %s via %s: %v", r.Net, r.Via, err))
			current[r.Net] = r.Via
			continue
		}
		done = append(done, Change{Op: "rm", Net: r.Net, Via: r.Via, Vxlan: r.Vxlan})
	}
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if _, ok := current[n]; ok {
			continue
		}
		if err := d.RouteAdd(n, want[n], vxlan); err != nil {
			refused = append(refused, fmt.Sprintf("adding the route to %s via %s: %v", n, want[n], err))
			continue
		}
		done = append(done, Change{Op: "add", Net: n, Via: want[n], Vxlan: vxlan})
	}
	return done, refused, nil
}
