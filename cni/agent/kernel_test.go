package agent

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// fakeKernel is a routing table in memory: the agent's routes, and a route that cannot be
// added (its gateway unreachable).
type fakeKernel struct {
	owned    map[string]string
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

func (f *fakeKernel) Replace(net, via string) error {
	if net == f.failAdd {
		return errors.New("network is unreachable")
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
	k := &fakeKernel{owned: map[string]string{
		"10.244.2.0/24": "192.168.1.2", // kept
		"10.244.3.0/24": "192.168.1.3", // its node moved
		"10.244.9.0/24": "192.168.1.9", // its node is gone
	}}
	want := map[string]string{
		"10.244.2.0/24": "192.168.1.2",
		"10.244.3.0/24": "192.168.1.33",
		"10.244.4.0/24": "192.168.1.4",
	}
	lines, err := ReconcileKernel(k, want, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(k.owned, want) {
		t.Fatalf("routes %v, want %v", k.owned, want)
	}
	wantLines := []string{
		"kernel route removed: 10.244.3.0/24 via 192.168.1.3",
		"kernel route removed: 10.244.9.0/24 via 192.168.1.9",
		"kernel route added: 10.244.3.0/24 via 192.168.1.33",
		"kernel route added: 10.244.4.0/24 via 192.168.1.4",
	}
	if !reflect.DeepEqual(lines, wantLines) {
		t.Fatalf("lines %q", lines)
	}
	// a second pass changes nothing
	if lines, err := ReconcileKernel(k, want, cluster); err != nil || len(lines) != 0 {
		t.Fatalf("second pass: %q %v", lines, err)
	}

	// a route that cannot be added, and ones outside the cluster or not IPv4, are errors; the
	// rest is still done
	k.failAdd = "10.244.5.0/24"
	want["10.244.5.0/24"] = "192.168.1.5"
	want["10.99.0.0/24"] = "192.168.1.6"
	want["10.0.0.0/8"] = "192.168.1.7"
	want["fd00::/64"] = "192.168.1.8"
	want["10.244.6.0/24"] = "192.168.1.6"
	lines, err = ReconcileKernel(k, want, cluster)
	if err == nil {
		t.Fatal("no error for the routes that could not be added")
	}
	for _, bad := range []string{"10.244.5.0/24", "10.99.0.0/24", "10.0.0.0/8", "fd00::/64"} {
		if !strings.Contains(err.Error(), bad) {
			t.Errorf("%s not in %v", bad, err)
		}
		if _, ok := k.owned[bad]; ok {
			t.Errorf("%s added", bad)
		}
	}
	if !reflect.DeepEqual(lines, []string{"kernel route added: 10.244.6.0/24 via 192.168.1.6"}) {
		t.Fatalf("lines %q", lines)
	}

	// a table that cannot be read changes nothing
	k.failList = true
	if _, err := ReconcileKernel(k, map[string]string{}, cluster); err == nil || len(k.owned) != 4 {
		t.Fatalf("%v %v", err, k.owned)
	}
}
