package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node whose pods' only network is DockNet, its daemon on a link to the node's own kernel
// (--host-link), its agent writing the conflist without routes (--routes=false); a namespace
// beyond the node stands for the world outside the cluster, reached through the node's NAT.
// Through the CRI as kubelet runs them: the node reaches a pod as kubelet's TCP probe and
// traffic does, and a pod reaches the outside through the node.
func TestAStandalonePodIsReachedByItsNodeAndReachesBeyondItThroughTheHostLink(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root (namespaces, containerd)")
	}
	const (
		cluster  = "10.75.0.0/16"
		nodeAddr = "192.168.81.1"
		outside  = "192.168.81.2"
	)
	ns, out := fmt.Sprintf("dnhostnode-%d", os.Getpid()), fmt.Sprintf("dnhostout-%d", os.Getpid())
	joined(t, ns, nodeAddr, out, outside)
	// the node forwards and masquerades its pods' traffic to the outside, as a cluster's
	// egress rule does
	for _, c := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"nft", "add", "table", "ip", "egress"},
		{"nft", "add", "chain", "ip", "egress", "post", "{ type nat hook postrouting priority srcnat; }"},
		{"nft", "add", "rule", "ip", "egress", "post", "ip", "saddr", cluster, "oifname", "eth0", "masquerade"},
	} {
		if o, err := inNetns(ns, c...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, o)
		}
	}

	e := hostLinkNode(t, "node-h", ns, nodeAddr, cluster, "10.75.1.0/24")
	if r := strings.TrimSpace(e.run(e.docknet, "--socket", e.sock, "route", "ls", "--json")); r != "[]" {
		t.Fatalf("routes over a host link: %s", r)
	}

	// the node to the pod: a kernel client in the node's namespace, as kubelet's TCP probe
	// and port-forward connect
	server := e.runPod("server", nil)
	if !strings.HasPrefix(server.ip, "10.75.1.") {
		t.Fatalf("pod address %s, want one of the node's pod network", server.ip)
	}
	e.start(server, "server", []string{"/dnperf", "server", "--stack", "docknet", "--bind", server.ip + ":5000"})
	var got clientReport
	err := waitFor("the node's client answered by the pod", 30*time.Second, func() bool {
		o, err := inNetns(ns, e.dnperf, "client", "--stack", "kernel", "--connect", server.ip+":5000",
			"--workload", "rr", "--size", "64", "--duration", "1", "--warmup", "0.2", "--json").Output()
		if err != nil {
			return false
		}
		lines := strings.Split(strings.TrimSpace(string(o)), "\n")
		got = lastJSON(t, lines)
		return got.Result.Transactions > 1000
	})
	if err != nil {
		t.Fatalf("%v (%d transactions)", err, got.Result.Transactions)
	}
	t.Logf("the node to its pod, 64 B ping-pong: one-way p50 %.2f us, %d transactions",
		float64(got.Result.OneWayNs.P50)/1e3, got.Result.Transactions)

	// the pod to the outside, through the node's NAT
	srv := inNetns(out, e.dnperf, "server", "--stack", "kernel", "--bind", outside+":6000")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	time.Sleep(300 * time.Millisecond)
	client := e.runPod("client", nil)
	id := e.start(client, "egress", []string{"/dnperf", "client", "--stack", "docknet", "--connect", outside + ":6000",
		"--workload", "rr", "--size", "64", "--duration", "1", "--warmup", "0.2", "--json"})
	egress := lastJSON(t, e.output(client, id, "egress", 60*time.Second))
	if egress.Result.Transactions < 1000 {
		t.Fatalf("only %d transactions from the pod to the outside", egress.Result.Transactions)
	}
	t.Logf("a pod to the outside through its node's NAT, 64 B ping-pong: one-way p50 %.2f us, %d transactions",
		float64(egress.Result.OneWayNs.P50)/1e3, egress.Result.Transactions)
}

// hostLinkNode starts a node whose pods' only network is DockNet, in the namespace ns where
// the node has address addr: its daemon on a link to the node's own kernel (--host-link), its
// agent writing the conflist for the node's pod network podCIDR (inside cluster) and leaving
// routes to the node's kernel (--routes=false).
func hostLinkNode(t *testing.T, name, ns, addr, cluster, podCIDR string) *env {
	t.Helper()
	nodes := filepath.Join(t.TempDir(), "nodes.json")
	writeNodes(t, nodes, nodeEntry(name, addr, podCIDR))
	return setupNode(t, nodeOpts{
		name:   name,
		netns:  ns,
		daemon: []string{"--host-link"},
		agent:  []string{"--cluster-cidr", cluster, "--nodes", nodes, "--routes=false"},
	})
}
