package agent

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

var cluster = netip.MustParsePrefix("10.244.0.0/16")

// fakeDaemon holds routes as the daemon would, and can be made to fail.
type fakeDaemon struct {
	mu     sync.Mutex
	routes map[string]string
	down   bool
	calls  int
	refuse map[string]bool   // networks whose add the daemon refuses
	vnis   map[string]uint32 // tunnelled routes' identifiers
}

func newFake(init map[string]string) *fakeDaemon {
	r := map[string]string{}
	for k, v := range init {
		r[k] = v
	}
	return &fakeDaemon{routes: r, vnis: map[string]uint32{}}
}

func (f *fakeDaemon) RouteLs() ([]Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return nil, errors.New("no daemon listening")
	}
	var out []Route
	for n, v := range f.routes {
		r := Route{Net: n, Via: v}
		if vni, ok := f.vnis[n]; ok {
			r.Vxlan = &vni
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Net < out[j].Net })
	return out, nil
}

func (f *fakeDaemon) RouteAdd(n, via string, vxlan *uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.routes[n]; ok {
		return errors.New("exists")
	}
	if f.refuse[n] {
		return errors.New("refused")
	}
	f.routes[n] = via
	if vxlan != nil {
		f.vnis[n] = *vxlan
	}
	return nil
}

func (f *fakeDaemon) RouteRm(n string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.routes[n]; !ok {
		return errors.New("not found")
	}
	delete(f.routes, n)
	delete(f.vnis, n)
	return nil
}

func (f *fakeDaemon) snapshot() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.routes {
		out[k] = v
	}
	return out
}

func TestDesiredRoutesOtherNodesAndSkipsWhatItCannotTrust(t *testing.T) {
	nodes := []Node{
		{Name: "n1", Address: "192.168.1.11", PodCIDRs: []string{"10.244.1.0/24", "fd00::/64"}},
		{Name: "n2", Address: "192.168.1.12", PodCIDRs: []string{"10.244.2.0/24"}},
		{Name: "n3", Address: "", PodCIDRs: []string{"10.244.3.0/24"}},
		{Name: "n4", Address: "192.168.1.14", PodCIDRs: []string{"10.99.4.0/24"}},
		{Name: "n5", Address: "192.168.1.15", PodCIDRs: []string{"10.244.5.1/24"}},
		{Name: "n6", Address: "192.168.1.16", PodCIDRs: []string{"10.244.2.0/24"}},
		{Name: "n7", Address: "fd00::7", PodCIDRs: []string{"10.244.7.0/24"}},
		{Name: "n8", Address: "192.168.1.18", PodCIDRs: []string{"10.244.1.128/25"}},
		{Name: "n9", Address: "10.244.9.1", PodCIDRs: []string{"10.244.9.0/24"}},
		{Name: "na", Address: "192.168.1.20", PodCIDRs: []string{"10.0.0.0/8"}},
		{Name: "nb", Address: "192.168.1.21", PodCIDRs: []string{"x"}},
		{Name: "nc", Address: "240.0.0.1", PodCIDRs: []string{"10.244.12.0/24"}},
		{Name: "nd", Address: "192.168.1.23", PodCIDRs: []string{"10.244.0.0/16"}},
		{Name: "ne", Address: "192.168.1.24", PodCIDRs: []string{"10.244.2.7/32"}},
		{Name: "nf", Address: "0.1.2.3", PodCIDRs: []string{"10.244.15.0/24"}},
	}
	want, skipped := Desired("n1", nodes, cluster)
	if !reflect.DeepEqual(want, map[string]string{"10.244.2.0/24": "192.168.1.12"}) {
		t.Fatalf("routes %v", want)
	}
	for _, s := range []string{`"n3"`, `"n4"`, `"n5"`, `"n6"`, `"n7"`, `"n8"`, `"n9"`, `"na"`, `"nb"`, `"nc"`, `"nd"`, `"ne"`, `"nf"`} {
		found := false
		for _, l := range skipped {
			found = found || strings.Contains(l, s)
		}
		if !found {
			t.Errorf("node %s not reported as skipped: %q", s, skipped)
		}
	}
	if len(skipped) != 13 {
		t.Errorf("%d skipped: %q", len(skipped), skipped)
	}
	// a name not among the nodes is said
	if _, skipped := Desired("nx", nodes[:2], cluster); len(skipped) != 1 || !strings.Contains(skipped[0], "--node-name") {
		t.Errorf("unknown self: %q", skipped)
	}
}

func TestReconcileChangesOnlyTheAgentsRoutes(t *testing.T) {
	d := newFake(map[string]string{
		"10.244.2.0/24": "192.168.1.12", // right: kept
		"10.244.3.0/24": "192.168.1.99", // wrong next hop: replaced
		"10.244.4.0/24": "192.168.1.14", // a node gone: removed
		"0.0.0.0/0":     "192.168.1.1",  // the operator's: left alone
		"10.0.0.0/8":    "192.168.1.2",  // the operator's (wider than the cluster): left alone
	})
	want := map[string]string{
		"10.244.2.0/24": "192.168.1.12",
		"10.244.3.0/24": "192.168.1.13",
		"10.244.5.0/24": "192.168.1.15",
	}
	changes, refused, err := Reconcile(d, want, cluster, nil)
	if err != nil || len(refused) != 0 {
		t.Fatal(refused, err)
	}
	got := d.snapshot()
	expect := map[string]string{
		"10.244.2.0/24": "192.168.1.12",
		"10.244.3.0/24": "192.168.1.13",
		"10.244.5.0/24": "192.168.1.15",
		"0.0.0.0/0":     "192.168.1.1",
		"10.0.0.0/8":    "192.168.1.2",
	}
	if !reflect.DeepEqual(got, expect) {
		t.Fatalf("routes %v", got)
	}
	if len(changes) != 4 {
		t.Fatalf("changes %v", changes)
	}
	// a second pass changes nothing: a restarted agent does not disturb traffic
	changes, _, err = Reconcile(d, want, cluster, nil)
	if err != nil || len(changes) != 0 {
		t.Fatalf("second pass: %v %v", changes, err)
	}
	// a route the daemon refuses does not keep the others out
	d.refuse = map[string]bool{"10.244.6.0/24": true}
	want["10.244.6.0/24"] = "192.168.1.16"
	want["10.244.7.0/24"] = "192.168.1.17"
	changes, refused, err = Reconcile(d, want, cluster, nil)
	if err != nil || len(refused) != 1 || !strings.Contains(refused[0], "10.244.6.0/24") ||
		len(changes) != 1 || changes[0].Net != "10.244.7.0/24" {
		t.Fatalf("with a refusal: %v %q %v", changes, refused, err)
	}
	// tunnels asked for: every route of the agent's is replaced by a tunnelled one, once
	vni := uint32(7)
	changes, refused, err = Reconcile(d, want, cluster, &vni)
	if err != nil || len(refused) != 1 || len(changes) != 8 {
		t.Fatalf("to tunnels: %v %q %v", changes, refused, err)
	}
	for n := range want {
		if got, ok := d.vnis[n]; n != "10.244.6.0/24" && (!ok || got != 7) {
			t.Fatalf("%s: not tunnelled (%v)", n, d.vnis)
		}
	}
	if _, ok := d.vnis["0.0.0.0/0"]; ok {
		t.Fatal("the operator's route was touched")
	}
	if changes, _, _ = Reconcile(d, want, cluster, &vni); len(changes) != 0 {
		t.Fatalf("tunnels again: %v", changes)
	}
	other := uint32(8)
	if changes, _, _ = Reconcile(d, want, cluster, &other); len(changes) != 8 {
		t.Fatalf("another identifier: %v", changes)
	}
	d.down = true
	if _, _, err := Reconcile(d, want, cluster, nil); err == nil {
		t.Fatal("a daemon that does not answer is an error")
	}
}

func node(name, addr string, cidrs ...string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDRs: cidrs},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name},
			{Type: corev1.NodeInternalIP, Address: addr},
		}},
	}
}

// waitFor polls until d's routes equal want, or fails after a second.
func waitFor(t *testing.T, d *fakeDaemon, want map[string]string, what string) {
	t.Helper()
	waitEqual(t, d.snapshot, want, what+": routes")
}

// waitEqual polls get until it returns want, or fails after a second naming what.
func waitEqual(t *testing.T, get func() map[string]string, want map[string]string, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		got := get()
		if reflect.DeepEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %v, want %v within 1 s", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNodesAddedChangedAndRemovedTakeEffectWithinASecond(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		node("self", "192.168.1.10", "10.244.0.0/24"),
		node("n1", "192.168.1.11", "10.244.1.0/24"),
	)
	src, err := NewKubeSource(ctx, client, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := newFake(map[string]string{"0.0.0.0/0": "192.168.1.1"})
	var logMu sync.Mutex
	var logs []string
	cfg := Config{Self: "self", Cluster: cluster, Resync: time.Hour, Log: func(s string) {
		logMu.Lock()
		logs = append(logs, s)
		logMu.Unlock()
	}}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, src, d) }()
	waitFor(t, d, map[string]string{"0.0.0.0/0": "192.168.1.1", "10.244.1.0/24": "192.168.1.11"}, "start")

	nodes := client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, node("n2", "192.168.1.12", "10.244.2.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"0.0.0.0/0": "192.168.1.1", "10.244.1.0/24": "192.168.1.11",
		"10.244.2.0/24": "192.168.1.12"}, "added")

	if _, err := nodes.Update(ctx, node("n1", "192.168.1.111", "10.244.1.0/24"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"0.0.0.0/0": "192.168.1.1", "10.244.1.0/24": "192.168.1.111",
		"10.244.2.0/24": "192.168.1.12"}, "changed")

	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"0.0.0.0/0": "192.168.1.1", "10.244.1.0/24": "192.168.1.111"}, "removed")

	// a node whose address is not an IPv4 address is skipped and said so once
	if _, err := nodes.Create(ctx, node("n3", "fd00::3", "10.244.3.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// another pass (a node changes): the skip is not said again
	if _, err := nodes.Update(ctx, node("n1", "192.168.1.112", "10.244.1.0/24"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"0.0.0.0/0": "192.168.1.1", "10.244.1.0/24": "192.168.1.112"}, "changed again")
	logMu.Lock()
	n := 0
	for _, l := range logs {
		if strings.Contains(l, `"n3"`) {
			n++
		}
	}
	logMu.Unlock()
	if n != 1 {
		t.Errorf("n3 skipped %d times in the log: %q", n, logs)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("run ended with %v", err)
	}
}

func TestAnUnavailableDaemonIsAskedAgainUntilItAnswers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newFake(nil)
	d.down = true
	src := staticNodes{{Name: "n1", Address: "192.168.1.11", PodCIDRs: []string{"10.244.1.0/24"}}}
	go func() { _ = Run(ctx, Config{Self: "self", Cluster: cluster, Resync: time.Hour}, src, d) }()
	time.Sleep(400 * time.Millisecond)
	d.mu.Lock()
	calls := d.calls
	d.down = false
	d.mu.Unlock()
	if calls < 2 {
		t.Fatalf("asked %d times while down", calls)
	}
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.11"}, "after the daemon came back")
}

func TestWithoutRoutesAPassOnlyFollowsThisNode(t *testing.T) {
	d := newFake(map[string]string{"10.244.9.0/24": "192.168.1.19"})
	src := staticNodes{
		{Name: "self", Address: "192.168.1.10", PodCIDRs: []string{"10.244.0.0/24"}},
		{Name: "n1", Address: "192.168.1.11", PodCIDRs: []string{"10.244.1.0/24"}},
	}
	var self []string
	cfg := Config{Self: "self", Cluster: cluster, NoRoutes: true, OnSelf: func(n Node) error {
		self = append(self, n.PodCIDRs...)
		return nil
	}}
	pass, err := Sync(cfg, src, d)
	if err != nil || len(pass.Changes) != 0 {
		t.Fatalf("pass %+v, err %v", pass, err)
	}
	if !reflect.DeepEqual(self, []string{"10.244.0.0/24"}) {
		t.Fatalf("this node's pod network: %v", self)
	}
	if got := d.snapshot(); !reflect.DeepEqual(got, map[string]string{"10.244.9.0/24": "192.168.1.19"}) {
		t.Fatalf("routes touched: %v", got)
	}
	if d.calls != 0 {
		t.Fatalf("the daemon was asked for its routes %d times", d.calls)
	}
}

func TestTheNodesFileIsReadAgainWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodes.json")
	write := func(s string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(`[{"name": "n1", "address": "192.168.1.11", "podCIDRs": ["10.244.1.0/24"]}]`)
	f := NewFileSource(path, 20*time.Millisecond)
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newFake(nil)
	go func() { _ = Run(ctx, Config{Self: "self", Cluster: cluster, Resync: time.Hour}, f, d) }()
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.11"}, "start")
	write(`[{"name": "n2", "address": "192.168.1.12", "podCIDRs": ["10.244.2.0/24"]}]`)
	waitFor(t, d, map[string]string{"10.244.2.0/24": "192.168.1.12"}, "changed file")
	// a broken file changes nothing
	write(`[{"name": "n2", "adress": "x"}]`)
	time.Sleep(200 * time.Millisecond)
	waitFor(t, d, map[string]string{"10.244.2.0/24": "192.168.1.12"}, "broken file")
	if _, err := f.Nodes(); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("broken file: %v", err)
	}
}
