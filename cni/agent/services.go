package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"docknet/cni/internal/daemon"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Service is one daemon service as the agent wants it.
type Service = daemon.Service

// ServicePrefix starts the name of every service the agent owns in the daemon: services
// without it (set by an operator) are never touched.
const ServicePrefix = "k8s."

// MaxServices bounds the services the agent hands the daemon (the daemon keeps at most 4096),
// and MaxBackends the backends of one.
const (
	MaxServices = 4096
	MaxBackends = 1024
)

// ServiceDaemon is what the agent needs of the daemon for services.
type ServiceDaemon interface {
	ServiceLs() ([]Service, error)
	ServiceSet(s Service) error
	ServiceRm(name string) error
}

// ServiceSource gives the cluster's Services and EndpointSlices, where this node is, and says
// when they may have changed.
type ServiceSource interface {
	Services() ([]*corev1.Service, []*discoveryv1.EndpointSlice, error)
	Locality() Locality
	ServicesChanged() <-chan struct{}
}

// Locality is where the node's pods call from: what `internalTrafficPolicy: Local` and
// topology-aware routing choose endpoints by. Each node's daemon balances only its own pods'
// calls, so each node's agent gives its daemon the endpoints its pods should reach, as
// kube-proxy programs each node.
type Locality struct {
	Node string // the node's name
	Zone string // its topology.kubernetes.io/zone label; "" when it has none
	// whether the node's Node object was found (without it, hints for zones are not used)
	Known bool
}

// ServiceName is the daemon's name for port port of Service ns/name: `k8s.NS.NAME.PORT`
// (the port's name, or its number when it has none).
func ServiceName(ns, name string, port corev1.ServicePort) string {
	p := port.Name
	if p == "" {
		p = strconv.Itoa(int(port.Port))
	}
	return ServicePrefix + ns + "." + name + "." + p
}

// DesiredServices computes the daemon's services from the cluster's: one per IPv4 ClusterIP
// and TCP or UDP port of every Service that has a ClusterIP, its backends the endpoints
// of the Service's EndpointSlices on the matching port that a pod of the node here reaches
// (Nearby). It returns them by name, and a line for each Service or port skipped (headless,
// SCTP, IPv6 only, a name the daemon cannot take).
func DesiredServices(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, here Locality) (map[string]Service, []string) {
	want := map[string]Service{}
	var skipped []string
	// slices by namespace/service
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range slices {
		owner := s.Labels[discoveryv1.LabelServiceName]
		if owner == "" || s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		k := s.Namespace + "/" + owner
		bySvc[k] = append(bySvc[k], s)
	}
	for _, svc := range svcs {
		id := svc.Namespace + "/" + svc.Name
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue // headless: DNS names the pods, nothing to balance
		}
		vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !vip.Is4() {
			skipped = append(skipped, fmt.Sprintf("service %s: cluster IP %q is not IPv4", id, svc.Spec.ClusterIP))
			continue
		}
		for _, port := range svc.Spec.Ports {
			if len(want) >= MaxServices {
				skipped = append(skipped, fmt.Sprintf("service %s: more than %d service ports", id, MaxServices))
				break
			}
			proto := strings.ToLower(string(port.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			if proto != "tcp" && proto != "udp" {
				skipped = append(skipped, fmt.Sprintf("service %s port %d: protocol %s", id, port.Port, port.Protocol))
				continue
			}
			name := ServiceName(svc.Namespace, svc.Name, port)
			if !validName(name) {
				skipped = append(skipped, fmt.Sprintf("service %s port %d: name %q too long for the daemon", id, port.Port, name))
				continue
			}
			affinity := "none"
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				affinity = "client-ip"
			}
			backends := addresses(Nearby(svc, endpoints(bySvc[id], port), here))
			if len(backends) > MaxBackends {
				skipped = append(skipped, fmt.Sprintf("service %s port %d: %d endpoints, the first %d kept", id, port.Port, len(backends), MaxBackends))
				backends = backends[:MaxBackends]
			}
			want[name] = Service{
				Name:     name,
				Address:  netip.AddrPortFrom(vip, uint16(port.Port)).String(),
				Proto:    proto,
				Backends: backends,
				Affinity: affinity,
			}
		}
	}
	return want, skipped
}

// Endpoint is one endpoint of a Service's port: its backend, its conditions and where it is.
type Endpoint struct {
	Backend string // IPv4:PORT
	// the endpoint's conditions as kube-proxy reads them: a Ready or Serving left out means
	// true, a Terminating left out false
	Ready, Serving, Terminating bool
	Node                        string   // the node it runs on ("" when the slice does not say)
	Zones                       []string // the zones it is hinted for (forZones)
	Nodes                       []string // the nodes it is hinted for (forNodes)
}

// endpoints are the endpoints of slices with an IPv4 address, on the slices' port matching port
// (by name, as kube-proxy matches them), sorted by backend, each once. A backend in two slices
// (a pod's address reused while the old pod terminates) is taken as kube-proxy takes it: an
// entry that is not terminating replaces one seen before, a terminating one never does; the
// slices are read in the order of their names, so a pass does not depend on the order the
// informer lists them in.
func endpoints(of []*discoveryv1.EndpointSlice, port corev1.ServicePort) []Endpoint {
	of = slices.SortedFunc(slices.Values(of), func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	seen := map[string]Endpoint{}
	for _, s := range of {
		var num int32
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if name == port.Name && proto == orTCP(port.Protocol) && p.Port != nil {
				num = *p.Port
			}
		}
		if num <= 0 || num > 65535 {
			continue
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				b := netip.AddrPortFrom(ip, uint16(num)).String()
				ep := endpointAt(b, e)
				if _, dup := seen[b]; !dup || !ep.Terminating {
					seen[b] = ep
				}
				break // the endpoint's first address, as kube-proxy takes it
			}
		}
	}
	out := make([]Endpoint, 0, len(seen))
	for _, b := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, seen[b])
	}
	return out
}

func endpointAt(backend string, e discoveryv1.Endpoint) Endpoint {
	c := e.Conditions
	out := Endpoint{
		Backend:     backend,
		Ready:       c.Ready == nil || *c.Ready,
		Serving:     c.Serving == nil || *c.Serving,
		Terminating: c.Terminating != nil && *c.Terminating,
	}
	if e.NodeName != nil {
		out.Node = *e.NodeName
	}
	if e.Hints != nil {
		for _, z := range e.Hints.ForZones {
			out.Zones = append(out.Zones, z.Name)
		}
		for _, n := range e.Hints.ForNodes {
			out.Nodes = append(out.Nodes, n.Name)
		}
	}
	return out
}

// Nearby chooses, of a Service's endpoints, the backends a pod on the node here reaches, by
// kube-proxy's rules:
//   - `internalTrafficPolicy: Local`: the ready endpoints on this node; when it has none, its
//     endpoints that are terminating but still serving; else none (calls are refused, where
//     kube-proxy drops them);
//   - otherwise the ready endpoints, narrowed by the hints the EndpointSlice controller wrote
//     (it writes them only for Services that ask, by `trafficDistribution` or the
//     `service.kubernetes.io/topology-mode` annotation): to those hinted for this node when
//     every ready endpoint carries node hints and some name this node, else to those hinted for
//     this node's zone on the same rule for zones, else not at all; when no endpoint is ready
//     anywhere, the endpoints that are terminating but still serving.
func Nearby(svc *corev1.Service, eps []Endpoint, here Locality) []Endpoint {
	local := func(e Endpoint) bool { return here.Node != "" && e.Node == here.Node }
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		if near := keepIf(eps, func(e Endpoint) bool { return e.Ready && local(e) }); len(near) > 0 {
			return near
		}
		return keepIf(eps, func(e Endpoint) bool { return local(e) && e.Serving && e.Terminating })
	}
	ready := keepIf(eps, func(e Endpoint) bool { return e.Ready })
	if len(ready) == 0 {
		return keepIf(eps, func(e Endpoint) bool { return e.Serving && e.Terminating })
	}
	if near, ok := hinted(ready, here.Node, func(e Endpoint) []string { return e.Nodes }); ok {
		return near
	}
	if near, ok := hinted(ready, here.Zone, func(e Endpoint) []string { return e.Zones }); ok {
		return near
	}
	return ready
}

// hinted is the endpoints whose hints (of one kind) name where, when every endpoint has hints
// of that kind and at least one names where (a node without a zone has zone "": only a hint
// naming "" matches it, as in kube-proxy).
func hinted(eps []Endpoint, where string, hints func(Endpoint) []string) ([]Endpoint, bool) {
	for _, e := range eps {
		if len(hints(e)) == 0 {
			return nil, false
		}
	}
	near := keepIf(eps, func(e Endpoint) bool { return slices.Contains(hints(e), where) })
	return near, len(near) > 0
}

func keepIf(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	out := []Endpoint{}
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

func addresses(eps []Endpoint) []string {
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.Backend)
	}
	return out
}

func orTCP(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// validName is the daemon's rule for names: 1-128 of [A-Za-z0-9_.-], not starting with . or -.
func validName(n string) bool {
	if n == "" || len(n) > 128 || n[0] == '.' || n[0] == '-' {
		return false
	}
	for _, c := range n {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

func sameService(a, b Service) bool {
	if a.Address != b.Address || a.Proto != b.Proto || a.Affinity != b.Affinity || len(a.Backends) != len(b.Backends) {
		return false
	}
	x := append([]string(nil), a.Backends...)
	y := append([]string(nil), b.Backends...)
	sort.Strings(x)
	sort.Strings(y)
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// ReconcileServices makes the daemon's services named with ServicePrefix equal to want:
// removes those not wanted, then sets those missing or different (endpoints changed). Other
// services are not touched. A service the daemon refuses does not stop the others: it is
// returned among the refusals. The error is for a daemon that could not be asked at all.
func ReconcileServices(d ServiceDaemon, want map[string]Service) (done []string, refused []string, err error) {
	have, err := d.ServiceLs()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the daemon's services: %w", err)
	}
	current := map[string]Service{}
	for _, s := range have {
		if !strings.HasPrefix(s.Name, ServicePrefix) {
			continue
		}
		if _, ok := want[s.Name]; ok {
			current[s.Name] = s
			continue
		}
		if err := d.ServiceRm(s.Name); err != nil {
			refused = append(refused, fmt.Sprintf("removing service %s: %v", s.Name, err))
			continue
		}
		done = append(done, "service rm "+s.Name)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w := want[n]
		if c, ok := current[n]; ok && sameService(c, w) {
			continue
		}
		if err := d.ServiceSet(w); err != nil {
			refused = append(refused, fmt.Sprintf("setting service %s (%s %s): %v", n, w.Proto, w.Address, err))
			continue
		}
		done = append(done, fmt.Sprintf("service set %s %s %s -> %s", n, w.Proto, w.Address, strings.Join(w.Backends, ",")))
	}
	return done, refused, nil
}

// SyncServices makes one pass: the source's Services into the daemon's.
func SyncServices(src ServiceSource, d ServiceDaemon, log func(string)) (Pass, error) {
	svcs, slices, err := src.Services()
	if err != nil {
		return Pass{}, fmt.Errorf("reading the services: %w", err)
	}
	here := src.Locality()
	want, skipped := DesiredServices(svcs, slices, here)
	if !here.Known {
		skipped = append(skipped, fmt.Sprintf("node %q: no such Node in the API, so no zone: endpoints hinted for zones are not chosen by zone", here.Node))
	}
	done, refused, err := ReconcileServices(d, want)
	for _, c := range done {
		if log != nil {
			log(c)
		}
	}
	return Pass{Skipped: skipped, Refused: refused}, err
}
