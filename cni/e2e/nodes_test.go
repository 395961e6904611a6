package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// joined makes namespaces a and b (removed when the test ends), each with lo up, and joins them
// by a veth that is eth0 in each, with addresses addrA and addrB on a /24.
func joined(t *testing.T, a, addrA, b, addrB string) {
	t.Helper()
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	for _, ns := range []string{a, b} {
		ip("netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
	for _, x := range [][2]string{{a, addrA}, {b, addrB}} {
		ip("-n", x[0], "addr", "add", x[1]+"/24", "dev", "eth0")
		ip("-n", x[0], "link", "set", "eth0", "up")
	}
}

// nodeEntry is one node as the agent's --nodes file lists it.
func nodeEntry(name, addr, podCIDR string) map[string]any {
	return map[string]any{"name": name, "address": addr, "podCIDRs": []string{podCIDR}}
}

// writeNodes writes the agent's --nodes file at path whole (a new file renamed over it: the
// agent reads it again when it changes).
func writeNodes(t *testing.T, path string, nodes ...map[string]any) {
	t.Helper()
	b, _ := json.Marshal(nodes)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Two nodes on one machine: each its own network namespace with its end of a wire, its own
// DockNet daemon driving that end (AF_XDP), its own node agent and its own containerd. The
// agents read the nodes from a file (the agent's test in cni/agent drives it through a real
// kube-apiserver): each writes its node's conflist and routes the other node's pod network
// through the other node's address. A pod on node A reaches a pod on node B through the CRI
// as kubelet would run them.
func TestPodsOnTwoNodesReachEachOtherThroughTheAgentsRoutes(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root (namespaces, containerd)")
	}
	const (
		cluster = "10.74.0.0/16"
		addrA   = "192.168.79.1"
		addrB   = "192.168.79.2"
	)
	nsA, nsB := fmt.Sprintf("dnnode-a-%d", os.Getpid()), fmt.Sprintf("dnnode-b-%d", os.Getpid())
	joined(t, nsA, addrA, nsB, addrB)

	nodes := filepath.Join(t.TempDir(), "nodes.json")
	nodeA, nodeB := nodeEntry("node-a", addrA, "10.74.1.0/24"), nodeEntry("node-b", addrB, "10.74.2.0/24")
	writeNodes(t, nodes, nodeA, nodeB)
	node := func(name, ns string) *env {
		return setupNode(t, nodeOpts{
			name:   name,
			netns:  ns,
			daemon: []string{"--nic", "eth0"},
			agent:  []string{"--cluster-cidr", cluster, "--nodes", nodes},
		})
	}
	a := node("node-a", nsA)
	b2 := node("node-b", nsB)

	server := b2.runPod("server", nil)
	b2.start(server, "server", []string{"/dnperf", "server", "--stack", "docknet", "--bind", server.ip + ":5000"})
	client := a.runPod("client", nil)
	var added unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &added)
	if !strings.HasPrefix(server.ip, "10.74.2.") || !strings.HasPrefix(client.ip, "10.74.1.") {
		t.Fatalf("pods' addresses %s (node B) and %s (node A), want each inside its node's pod network", server.ip, client.ip)
	}
	var routes []map[string]string
	if err := json.Unmarshal([]byte(a.run(a.docknet, "--socket", a.sock, "route", "ls", "--json")), &routes); err != nil {
		t.Fatal(err)
	}
	if len(routes) != 1 || routes[0]["net"] != "10.74.2.0/24" || routes[0]["via"] != addrB {
		t.Fatalf("node A's routes %v", routes)
	}

	// the client pod's first packet to the other node: a container started right after its ADD
	// connects again until the server answers
	id := a.start(client, "reach", []string{"/dnperf", "reach", "--stack", "docknet", "--connect", server.ip + ":5000"})
	lines := a.output(client, id, "reach", 60*time.Second)
	var reach struct {
		Start   int64  `json:"start_ns"`
		Connect int64  `json:"connect_ns"`
		Tries   uint64 `json:"connect_tries"`
	}
	if len(lines) == 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &reach) != nil || reach.Connect < reach.Start {
		t.Fatalf("reach: %q", lines)
	}
	t.Logf("first connect across the nodes: %.1f ms after the client pod's ADD returned (container start included), "+
		"%.2f ms after the program started trying, %d tries",
		float64(reach.Connect-added.Nano())/1e6, float64(reach.Connect-reach.Start)/1e6, reach.Tries)

	id = a.start(client, "client", []string{"/dnperf", "client", "--stack", "docknet", "--connect", server.ip + ":5000",
		"--workload", "rr", "--size", "64", "--duration", "2", "--warmup", "0.5", "--json"})
	got := lastJSON(t, a.output(client, id, "client", 60*time.Second))
	t.Logf("64 B ping-pong between pods on two nodes: one-way p50 %.2f us, p99 %.2f us, %d transactions",
		float64(got.Result.OneWayNs.P50)/1e3, float64(got.Result.OneWayNs.P99)/1e3, got.Result.Transactions)
	if got.Result.Transactions < 1000 {
		t.Fatalf("only %d transactions between the pods", got.Result.Transactions)
	}
	// 100 MB checked from node A's pod to node B's (the server's threads serve each connection)
	id = a.start(client, "check", []string{"/dnperf", "client", "--stack", "docknet", "--connect", server.ip + ":5000",
		"--workload", "check", "--bytes", "100000000", "--size", "65536", "--json"})
	lines = a.output(client, id, "check", 120*time.Second)
	var check struct {
		Result struct {
			Bytes   uint64 `json:"bytes"`
			Corrupt uint64 `json:"corrupt_bytes"`
		} `json:"result"`
	}
	if len(lines) == 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &check) != nil ||
		check.Result.Bytes != 100000000 || check.Result.Corrupt != 0 {
		t.Fatalf("100 MB across the nodes: %q", lines)
	}

	// node B leaves the cluster and comes back: node A's route follows within a second
	routesOfA := func() string { return a.run(a.docknet, "--socket", a.sock, "route", "ls", "--json") }
	writeNodes(t, nodes, nodeA)
	if err := waitFor("node A's route to node B removed", time.Second, func() bool { return strings.TrimSpace(routesOfA()) == "[]" }); err != nil {
		t.Fatalf("%v: %s", err, routesOfA())
	}
	writeNodes(t, nodes, nodeA, nodeB)
	if err := waitFor("node A's route to node B back", time.Second, func() bool { return strings.Contains(routesOfA(), addrB) }); err != nil {
		t.Fatalf("%v: %s", err, routesOfA())
	}

	// kubelet's teardown on each node leaves no pipe
	for _, np := range []struct {
		e *env
		p *pod
	}{{a, client}, {b2, server}} {
		np.e.removePod(np.p)
		if ps := np.e.pipes(); len(ps) != 0 {
			t.Fatalf("node %s: pipes left after its pod went: %v", np.e.node, ps)
		}
	}
}
