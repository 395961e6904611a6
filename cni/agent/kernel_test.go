package agent

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// fakeKernel is a routing table in memory: the agent's routes, routes of others, and a route
// that cannot be added (its gateway unreachable).
type fakeKernel struct {
	owned    map[string]string
	others   map[string]string
	failAdd  string
	failList bool
}

func (f *fakeKernel) Owned() (map[string]string, error) {
	if f.failList {
		return nil, errors.New("netlink: permission denied")
	}
	out := map[string]string{}
	for k, v := range f.owned {
		out[k] = v
	}
	return out, nil
}

func (f *fakeKernel) Add(net, via string) error {
	if _, ok := f.others[net]; ok {
		return errors.New("file exists")
	}
	if _, ok := f.owned[net]; ok {
		return errors.New("file exists")
	}
	if net == f.failAdd {
		return errors.New("network is unreachable")
	}
	f.owned[net] = via
	return nil
}

func (f *fakeKernel) Change(net, via string) error {
	if _, ok := f.owned[net]; !ok {
		return errors.New("no such route")
	}
	f.owned[net] = via
	return nil
}

func (f *fakeKernel) Delete(net, via string) error {
	if f.owned[net] != via {
		return errors.New("no such route")
	}
	delete(f.owned, net)
	return nil
}

func TestKernelRoutesFollowTheNodesAndOnlyTheAgentsAreTouched(t *testing.T) {
	cluster := netip.MustParsePrefix("10.244.0.0/16")
	k := &fakeKernel{
		owned: map[string]string{
			"10.244.2.0/24": "192.168.1.2", // kept
			"10.244.3.0/24": "192.168.1.3", // its node moved
			"10.244.9.0/24": "192.168.1.9", // its node is gone
		},
		// the operator's (or another network's) route to a node's pod network
		others: map[string]string{"10.244.7.0/24": "192.168.1.70"},
	}
	want := map[string]string{
		"10.244.2.0/24": "192.168.1.2",
		"10.244.3.0/24": "192.168.1.33",
		"10.244.4.0/24": "192.168.1.4",
	}
	changes, refused, err := ReconcileKernel(k, want, cluster)
	if err != nil || len(refused) > 0 {
		t.Fatal(err, refused)
	}
	if !reflect.DeepEqual(k.owned, want) {
		t.Fatalf("routes %v, want %v", k.owned, want)
	}
	wantLines := []string{
		"kernel route removed: 10.244.9.0/24 via 192.168.1.9",
		"kernel route changed: 10.244.3.0/24 via 192.168.1.33 (was via 192.168.1.3)",
		"kernel route added: 10.244.4.0/24 via 192.168.1.4",
	}
	if !reflect.DeepEqual(changes, wantLines) {
		t.Fatalf("changes %q", changes)
	}
	// a second pass changes nothing
	if changes, refused, err := ReconcileKernel(k, want, cluster); err != nil || len(changes)+len(refused) != 0 {
		t.Fatalf("second pass: %q %q %v", changes, refused, err)
	}

	// a route that cannot be added, one over another's route, and ones outside the cluster or
	// not IPv4 are refused, each with its reason; the rest is still done
	k.failAdd = "10.244.5.0/24"
	want["10.244.5.0/24"] = "192.168.1.5"
	want["10.244.7.0/24"] = "192.168.1.7"
	want["10.99.0.0/24"] = "192.168.1.6"
	want["10.0.0.0/8"] = "192.168.1.7"
	want["fd00::/64"] = "192.168.1.8"
	want["10.244.6.0/24"] = "192.168.1.6"
	changes, refused, err = ReconcileKernel(k, want, cluster)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(refused, "\n")
	for _, bad := range []string{"10.244.5.0/24", "10.244.7.0/24 via 192.168.1.7: file exists", "10.99.0.0/24", "10.0.0.0/8", "fd00::/64"} {
		if !strings.Contains(all, bad) {
			t.Errorf("%s not refused: %s", bad, all)
		}
	}
	if len(refused) != 5 {
		t.Errorf("refused %q", refused)
	}
	if k.others["10.244.7.0/24"] != "192.168.1.70" || k.owned["10.244.7.0/24"] != "" {
		t.Errorf("another's route taken over: %v %v", k.others, k.owned)
	}
	if !reflect.DeepEqual(changes, []string{"kernel route added: 10.244.6.0/24 via 192.168.1.6"}) {
		t.Fatalf("changes %q", changes)
	}

	// a table that cannot be read changes nothing
	k.failList = true
	if _, _, err := ReconcileKernel(k, map[string]string{}, cluster); err == nil || len(k.owned) != 4 {
		t.Fatalf("%v %v", err, k.owned)
	}
}
