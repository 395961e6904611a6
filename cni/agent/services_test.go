package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeServices holds services as the daemon would, refusing what it would refuse.
type fakeServices struct {
	mu  sync.Mutex
	all map[string]Service
}

func (f *fakeServices) ServiceLs() ([]Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Service
	for _, s := range f.all {
		out = append(out, s)
	}
	return out, nil
}

func (f *fakeServices) ServiceSet(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range s.Backends {
		if strings.HasPrefix(b, "127.") {
			return errors.New("not a unicast address")
		}
	}
	f.all[s.Name] = s
	return nil
}

func (f *fakeServices) ServiceRm(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.all, name)
	return nil
}

// view is the services as "proto address -> backends", by name.
func (f *fakeServices) view() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for n, s := range f.all {
		b := append([]string(nil), s.Backends...)
		sort.Strings(b)
		out[n] = fmt.Sprintf("%s %s %s -> %s", s.Proto, s.Address, s.Affinity, strings.Join(b, ","))
	}
	return out
}

func waitServices(t *testing.T, d *fakeServices, want map[string]string, what string) {
	t.Helper()
	waitEqual(t, d.view, want, what+": services")
}

func svc(name, clusterIP string, affinity corev1.ServiceAffinity, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports, SessionAffinity: affinity},
	}
}

func port(name string, p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: p, Protocol: proto}
}

type ep struct {
	ip    string
	ready *bool
}

func slice(name, owner string, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: owner},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for n, p := range ports {
		n, p := n, p
		proto := corev1.ProtocolTCP
		if strings.HasPrefix(n, "dns") {
			proto = corev1.ProtocolUDP
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &n, Port: &p, Protocol: &proto})
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready},
		})
	}
	return s
}

func TestServicesFollowTheirReadyEndpointsWithinASecond(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	no := false
	client := fake.NewClientset(
		svc("web", "10.96.0.10", corev1.ServiceAffinityNone,
			port("http", 80, corev1.ProtocolTCP), port("dns", 53, corev1.ProtocolUDP)),
		slice("web-1", "web", map[string]int32{"http": 8080, "dns": 5353},
			ep{"10.244.1.2", nil}, ep{"10.244.1.3", nil}, ep{"10.244.1.4", &no}),
		// headless, IPv6 only, SCTP: nothing to balance here
		svc("headless", corev1.ClusterIPNone, corev1.ServiceAffinityNone, port("", 80, corev1.ProtocolTCP)),
		svc("v6", "fd00::10", corev1.ServiceAffinityNone, port("", 80, corev1.ProtocolTCP)),
		svc("sctp", "10.96.0.12", corev1.ServiceAffinityNone, port("", 9, corev1.ProtocolSCTP)),
	)
	src, err := NewKubeServices(ctx, client, 0, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	// an operator's own service is left alone
	d := &fakeServices{all: map[string]Service{"mine": {Name: "mine", Address: "10.97.0.1:80", Proto: "tcp", Affinity: "none"}}}
	mine := "tcp 10.97.0.1:80 none -> "
	done := make(chan error, 1)
	go func() { done <- RunServices(ctx, Config{Resync: time.Hour}, src, d) }()
	waitServices(t, d, map[string]string{
		"mine":                 mine,
		"k8s.default.web.http": "tcp 10.96.0.10:80 none -> 10.244.1.2:8080,10.244.1.3:8080",
		"k8s.default.web.dns":  "udp 10.96.0.10:53 none -> 10.244.1.2:5353,10.244.1.3:5353",
	}, "start")
	// this node has no Node in this API: said among the skipped lines
	if p, err := SyncServices(src, d, nil); err != nil || !slices.ContainsFunc(p.Skipped, func(l string) bool {
		return strings.Contains(l, `node "node-1": no such Node`)
	}) {
		t.Fatalf("a node missing from the API is not said: %q %v", p.Skipped, err)
	}

	// an endpoint stops being ready; affinity changes
	slices := client.DiscoveryV1().EndpointSlices("default")
	if _, err := slices.Update(ctx, slice("web-1", "web", map[string]int32{"http": 8080, "dns": 5353},
		ep{"10.244.1.2", nil}, ep{"10.244.1.3", &no}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	services := client.CoreV1().Services("default")
	if _, err := services.Update(ctx, svc("web", "10.96.0.10", corev1.ServiceAffinityClientIP,
		port("http", 80, corev1.ProtocolTCP), port("dns", 53, corev1.ProtocolUDP)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{
		"mine":                 mine,
		"k8s.default.web.http": "tcp 10.96.0.10:80 client-ip -> 10.244.1.2:8080",
		"k8s.default.web.dns":  "udp 10.96.0.10:53 client-ip -> 10.244.1.2:5353",
	}, "endpoint not ready")

	// a second slice of the same service adds its endpoints
	if _, err := slices.Create(ctx, slice("web-2", "web", map[string]int32{"http": 8080},
		ep{"10.244.2.2", nil}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{
		"mine":                 mine,
		"k8s.default.web.http": "tcp 10.96.0.10:80 client-ip -> 10.244.1.2:8080,10.244.2.2:8080",
		"k8s.default.web.dns":  "udp 10.96.0.10:53 client-ip -> 10.244.1.2:5353",
	}, "second slice")

	// the service goes: its daemon services go, the operator's stays
	if err := services.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{"mine": mine}, "removed")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run ended with %v", err)
	}
}

func TestServicesTheDaemonRefusesDoNotStopTheOthers(t *testing.T) {
	want, skipped := DesiredServices(
		[]*corev1.Service{
			svc("bad", "10.96.0.20", "", port("", 80, "")),
			svc("good", "10.96.0.21", "", port("", 80, "")),
			svc("sctp", "10.96.0.22", "", port("", 9, corev1.ProtocolSCTP)),
			svc(strings.Repeat("x", 130), "10.96.0.23", "", port("", 80, "")),
		},
		[]*discoveryv1.EndpointSlice{
			slice("b", "bad", map[string]int32{"": 80}, ep{"127.0.0.1", nil}),
			slice("g", "good", map[string]int32{"": 80}, ep{"10.244.1.9", nil}, ep{"fd00::9", nil}),
		},
		Locality{Node: "n1"},
	)
	if len(skipped) != 2 {
		t.Errorf("skipped %q, want the SCTP port and the long name", skipped)
	}
	d := &fakeServices{all: map[string]Service{}}
	done, refused, err := ReconcileServices(d, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 1 || !strings.Contains(refused[0], "k8s.default.bad.80") {
		t.Errorf("refused %q", refused)
	}
	if len(done) != 1 {
		t.Errorf("done %q", done)
	}
	if got := d.view()["k8s.default.good.80"]; got != "tcp 10.96.0.21:80 none -> 10.244.1.9:80" {
		t.Errorf("good: %q", got)
	}
	// a second pass changes nothing
	done, _, _ = ReconcileServices(d, want)
	if len(done) != 0 {
		t.Errorf("second pass did %q", done)
	}
}

func TestEachNodeGetsTheEndpointsItsPodsReachAsKubeProxyChoosesThem(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	with := func(itp *corev1.ServiceInternalTrafficPolicy) *corev1.Service {
		s := svc("web", "10.96.0.10", "", port("", 80, ""))
		s.Spec.InternalTrafficPolicy = itp
		return s
	}
	at := func(b, node string, zones, nodes []string) Endpoint {
		return Endpoint{Backend: b, Ready: true, Serving: true, Node: node, Zones: zones, Nodes: nodes}
	}
	// terminating: not ready, still serving (or not)
	leaving := func(e Endpoint, serving bool) Endpoint {
		e.Ready, e.Serving, e.Terminating = false, serving, true
		return e
	}
	zoned := []Endpoint{
		at("10.244.1.2:80", "n1", []string{"a"}, nil),
		at("10.244.2.2:80", "n2", []string{"a"}, nil),
		at("10.244.3.2:80", "n3", []string{"b"}, nil),
	}
	noded := []Endpoint{
		at("10.244.1.2:80", "n1", []string{"a"}, []string{"n1"}),
		at("10.244.2.2:80", "n2", []string{"a"}, []string{"n2"}),
		at("10.244.3.2:80", "n3", []string{"b"}, []string{"n3"}),
	}
	plain := []Endpoint{at("10.244.1.2:80", "n1", nil, nil), at("10.244.3.2:80", "n3", nil, nil)}
	inA, inB := Locality{Node: "n1", Zone: "a", Known: true}, Locality{Node: "n3", Zone: "b", Known: true}
	for _, c := range []struct {
		what string
		svc  *corev1.Service
		eps  []Endpoint
		here Locality
		want string
	}{
		{"no hints: every ready endpoint", with(nil), plain, inA, "10.244.1.2:80,10.244.3.2:80"},
		{"internal traffic Cluster, no hints: every ready endpoint", with(&cluster), plain, inB, "10.244.1.2:80,10.244.3.2:80"},
		{"zone hints: this zone's", with(nil), zoned, inA, "10.244.1.2:80,10.244.2.2:80"},
		{"zone hints, the other zone: its own", with(nil), zoned, inB, "10.244.3.2:80"},
		{"node hints: this node's", with(nil), noded, inA, "10.244.1.2:80"},
		{"node hints, none for this node: this zone's", with(nil), noded, Locality{Node: "n9", Zone: "a", Known: true},
			"10.244.1.2:80,10.244.2.2:80"},
		{"zone hints, a node without a zone: every ready endpoint", with(nil), zoned, Locality{Node: "n9", Known: true},
			"10.244.1.2:80,10.244.2.2:80,10.244.3.2:80"},
		{"zone hints, none for this zone: every ready endpoint", with(nil), zoned, Locality{Node: "n4", Zone: "c", Known: true},
			"10.244.1.2:80,10.244.2.2:80,10.244.3.2:80"},
		{"one ready endpoint without hints: every ready endpoint", with(nil),
			append([]Endpoint{at("10.244.4.2:80", "n4", nil, nil)}, zoned...), inA,
			"10.244.4.2:80,10.244.1.2:80,10.244.2.2:80,10.244.3.2:80"},
		{"a terminating endpoint without hints does not turn hints off", with(nil),
			append([]Endpoint{leaving(at("10.244.4.2:80", "n4", nil, nil), true)}, zoned...), inA,
			"10.244.1.2:80,10.244.2.2:80"},
		{"nothing ready: the terminating endpoints still serving", with(nil),
			[]Endpoint{leaving(plain[0], true), leaving(plain[1], false)}, inB, "10.244.1.2:80"},
		{"nothing ready or serving: none", with(nil), []Endpoint{leaving(plain[0], false)}, inA, ""},
		{"nothing ready, one serving but not terminating: none", with(nil),
			[]Endpoint{{Backend: "10.244.1.2:80", Serving: true, Node: "n1"}}, inA, ""},
		{"zone hints and a node without a zone: only a hint naming no zone matches", with(nil),
			[]Endpoint{at("10.244.1.2:80", "n1", []string{""}, nil), at("10.244.3.2:80", "n3", []string{"b"}, nil)},
			Locality{Node: "n9", Known: true}, "10.244.1.2:80"},
		{"internal traffic Local: this node's", with(&local), noded, inB, "10.244.3.2:80"},
		{"internal traffic Local ignores hints", with(&local), []Endpoint{at("10.244.1.2:80", "n1", []string{"b"}, []string{"n3"})}, inA,
			"10.244.1.2:80"},
		{"internal traffic Local, none here: none", with(&local), noded, Locality{Node: "n9", Zone: "a", Known: true}, ""},
		{"internal traffic Local, endpoints without nodes, a node without a name: none", with(&local),
			[]Endpoint{at("10.244.1.2:80", "", nil, nil)}, Locality{}, ""},
		{"internal traffic Local, this node's terminating one still serving, another node's ready: this node's", with(&local),
			[]Endpoint{leaving(plain[0], true), plain[1]}, inA, "10.244.1.2:80"},
		{"internal traffic Local, this node's one terminating and not serving: none", with(&local),
			[]Endpoint{leaving(plain[0], false), plain[1]}, inA, ""},
		{"internal traffic Local, this node's one serving but not terminating: none", with(&local),
			[]Endpoint{{Backend: "10.244.1.2:80", Serving: true, Node: "n1"}, plain[1]}, inA, ""},
	} {
		if got := strings.Join(addresses(Nearby(c.svc, c.eps, c.here)), ","); got != c.want {
			t.Errorf("%s: got %q, want %q", c.what, got, c.want)
		}
	}

	// from the slices: conditions, nodes and hints of each endpoint reach the choice, and a
	// backend in two slices is taken as kube-proxy takes it, whatever the order listed
	n1, n3, yes, no := "n1", "n3", true, false
	s := slice("w-1", "web", map[string]int32{"": 8080}, ep{"10.244.1.2", nil}, ep{"10.244.3.2", nil}, ep{"10.244.5.2", &no})
	s.Endpoints[0].NodeName, s.Endpoints[1].NodeName = &n1, &n3
	s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}}
	s.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "b"}}}
	s.Endpoints[2].Conditions.Serving, s.Endpoints[2].Conditions.Terminating = &yes, &yes
	// the same backend again in a later slice, with other hints
	dup := slice("w-2", "web", map[string]int32{"": 8080}, ep{"10.244.3.2", nil})
	dup.Endpoints[0].NodeName = &n3
	dup.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}}
	// a pod's address reused: terminating in the slice named first, ready in the later one
	reusedOld := slice("r-1", "web", map[string]int32{"": 8080}, ep{"10.244.7.2", &no})
	reusedOld.Endpoints[0].Conditions.Serving, reusedOld.Endpoints[0].Conditions.Terminating = &yes, &yes
	reusedNew := slice("r-2", "web", map[string]int32{"": 8080}, ep{"10.244.7.2", nil}, ep{"10.244.9.2", nil})
	// nothing ready, conditions otherwise left out: serving (by default) but not terminating
	notReady := slice("n-1", "web", map[string]int32{"": 8080}, ep{"10.244.8.2", &no})
	for _, c := range []struct {
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		here   Locality
		want   string
	}{
		{with(nil), []*discoveryv1.EndpointSlice{s}, inB, "tcp 10.96.0.10:80 none -> 10.244.3.2:8080"},
		// 10.244.3.2 ready in both: the later slice's copy (zone a) is kept, whatever the order
		// listed, so no endpoint is hinted for zone b
		{with(nil), []*discoveryv1.EndpointSlice{dup, s}, inB, "tcp 10.96.0.10:80 none -> 10.244.1.2:8080,10.244.3.2:8080"},
		{with(nil), []*discoveryv1.EndpointSlice{s, dup}, inA, "tcp 10.96.0.10:80 none -> 10.244.1.2:8080,10.244.3.2:8080"},
		{with(&local), []*discoveryv1.EndpointSlice{s}, inA, "tcp 10.96.0.10:80 none -> 10.244.1.2:8080"},
		{with(nil), []*discoveryv1.EndpointSlice{s}, Locality{Node: "n1", Known: true}, "tcp 10.96.0.10:80 none -> 10.244.1.2:8080,10.244.3.2:8080"},
		{with(nil), []*discoveryv1.EndpointSlice{reusedNew, reusedOld}, inA, "tcp 10.96.0.10:80 none -> 10.244.7.2:8080,10.244.9.2:8080"},
		{with(nil), []*discoveryv1.EndpointSlice{reusedOld}, inA, "tcp 10.96.0.10:80 none -> 10.244.7.2:8080"},
		{with(nil), []*discoveryv1.EndpointSlice{notReady}, inA, "tcp 10.96.0.10:80 none -> "},
	} {
		want, _ := DesiredServices([]*corev1.Service{c.svc}, c.slices, c.here)
		d := &fakeServices{all: map[string]Service{}}
		if _, _, err := ReconcileServices(d, want); err != nil {
			t.Fatal(err)
		}
		if got := d.view()["k8s.default.web.80"]; got != c.want {
			t.Errorf("%d slices from %v: got %q, want %q", len(c.slices), c.here, got, c.want)
		}
	}
}
