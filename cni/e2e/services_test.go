package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A Service by its name, through containerd's CRI as kubelet runs pods whose only network is
// DockNet: the cluster's DNS is a Service too (its server on the node's network, as a
// hostNetwork DNS pod or NodeLocal DNSCache runs), the client pod gets the runtime's
// /etc/resolv.conf, and unmodified programs under the preload library (curl, getent) resolve
// the Service's name and call it, one new process and connection per request, while the
// Service's backends are scaled down and up the way a Deployment's rollout does: out of the
// Service first, then stopped; started, ready to kubelet's HTTP probe, then in. No request
// may fail, and the new backend must serve.
func TestAServiceByItsNameKeepsAnsweringWhileItsPodsAreReplaced(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root (namespaces, containerd)")
	}
	const (
		cluster  = "10.73.0.0/16"
		nodeAddr = "192.168.83.1"
		outside  = "192.168.83.2"
		dnsVIP   = "10.96.0.10"
		webVIP   = "10.96.0.20"
		domain   = "docknet-e2e.svc.cluster.local"
	)
	ns, out := fmt.Sprintf("dnsvcnode-%d", os.Getpid()), fmt.Sprintf("dnsvcout-%d", os.Getpid())
	joined(t, ns, nodeAddr, out, outside)
	e := hostLinkNode(t, "node-s", ns, nodeAddr, cluster, "10.73.1.0/24")

	// the cluster's DNS server, on the node's address
	dnsd := filepath.Join(e.dir, "dnsd")
	if o, err := exec.Command("go", "build", "-trimpath", "-o", dnsd, "./dnsd").CombinedOutput(); err != nil {
		t.Fatalf("building dnsd: %v\n%s", err, o)
	}
	dnsLog := filepath.Join(e.dir, "dnsd.log")
	logf, err := os.Create(dnsLog)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	dns := inNetns(ns, dnsd, "--listen", nodeAddr+":53", "web."+domain+"="+webVIP)
	dns.Stderr = logf
	if err := dns.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(dns, 5*time.Second) })

	// the backends, each ready once the node's HTTP probe is answered
	backend := func(name string) (*pod, string) {
		p := e.runPod(name, nil)
		id := e.start(p, "httpd", []string{"/docknet-httpd", "--stack", "docknet", "--bind", p.ip + ":8080"})
		e.probe(ns, "http://"+p.ip+":8080/hello.txt")
		return p, id
	}
	web0, _ := backend("web-0")
	web1, _ := backend("web-1")
	service := func(name, vip string, extra []string, backends ...string) {
		args := []string{"--socket", e.sock, "service", "set", name, vip}
		for _, b := range backends {
			args = append(args, "--backend", b)
		}
		e.run(e.docknet, append(args, extra...)...)
	}
	// named as the node agent names what it programs from Services and EndpointSlices (the
	// Services' ports named dns and http)
	service("k8s.kube-system.kube-dns.dns", dnsVIP+":53", []string{"--udp"}, nodeAddr+":53")
	service("k8s.docknet-e2e.web.http", webVIP+":80", nil, web0.ip+":8080", web1.ip+":8080")

	// the client: resolves the names, then calls the Service by name until told to stop
	ctl := t.TempDir()
	client := e.runPodDNS("client", nil, &cri.DNSConfig{
		Servers:  []string{dnsVIP},
		Searches: []string{domain, "svc.cluster.local", "cluster.local"},
		Options:  []string{"ndots:5"},
	})
	script := `while read -r l; do echo "$l"; done </etc/resolv.conf
/getent hosts web || echo "web: not resolved"
/getent hosts nosuch || echo "nosuch: not found"
i=0
while [ ! -e /ctl/stop ]; do
  i=$((i+1))
  code=$(/curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://web/hello.txt)
  if [ "$code" = 200 ]; then echo "ok $i"; else echo "FAIL $i $code"; fi
done
echo "done $i"`
	cid := e.startWith(client, "calls", []string{"/bin/sh", "-c", script},
		map[string]string{"LD_PRELOAD": preloadPath},
		[]*cri.Mount{{ContainerPath: "/ctl", HostPath: ctl}})
	// the client's lines so far, and the calls answered and failed among them
	lines := func() []string { return stdoutLines(fileText(filepath.Join(client.logDir, "calls.log"))) }
	count := func(lines []string) (ok int, failed []string) {
		for _, l := range lines {
			switch {
			case strings.HasPrefix(l, "ok "):
				ok++
			case strings.HasPrefix(l, "FAIL "):
				failed = append(failed, l)
			}
		}
		return ok, failed
	}
	wait := func(what string, more int) {
		t.Helper()
		start, _ := count(lines())
		var seen []string
		var ok int
		var failed []string
		err := waitFor(what, 90*time.Second, func() bool {
			seen = lines()
			ok, failed = count(seen)
			return len(failed) > 0 || ok >= start+more
		})
		if err != nil || len(failed) > 0 {
			t.Fatalf("%s: %d calls answered, failed %v (%v); client's lines:\n%s\ndnsd:\n%s", what, ok, failed, err,
				tail(strings.Join(seen, "\n"), 20), tail(fileText(dnsLog), 10))
		}
	}
	wait("calls to the Service by name", 20)

	// scale down: web-0 out of the Service, then, after a grace period, its pod stopped
	service("k8s.docknet-e2e.web.http", webVIP+":80", nil, web1.ip+":8080")
	time.Sleep(1500 * time.Millisecond)
	e.removePod(web0)
	wait("calls with web-0 gone", 20)

	// scale up: web-2 started, ready, then in the Service
	web2, web2httpd := backend("web-2")
	service("k8s.docknet-e2e.web.http", webVIP+":80", nil, web1.ip+":8080", web2.ip+":8080")
	wait("calls with web-2 in", 30)

	if err := os.WriteFile(filepath.Join(ctl, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	said := e.output(client, cid, "calls", 60*time.Second)
	ok, failed := count(said)
	all := strings.Join(said, "\n")
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed: %v\nclient's log:\n%s", len(failed), ok+len(failed), failed, all)
	}
	if !strings.Contains(all, "nameserver "+dnsVIP) || !strings.Contains(all, "search "+domain) {
		t.Fatalf("the pod's resolv.conf is not the cluster's:\n%s", all)
	}
	resolved := slices.ContainsFunc(said, func(l string) bool {
		f := strings.Fields(l)
		return len(f) >= 2 && f[0] == webVIP && f[1] == "web."+domain
	})
	if !resolved {
		t.Fatalf("getent did not resolve web to %s as web.%s:\n%s", webVIP, domain, all)
	}
	// a name nobody has: asked (the DNS Service answered it) and not found
	if !strings.Contains(all, "nosuch: not found") || !strings.Contains(fileText(dnsLog), "nosuch."+domain+". TypeA: no such name") {
		t.Fatalf("a name nobody has was not asked and refused:\n%s\ndnsd:\n%s", all, tail(fileText(dnsLog), 20))
	}

	// web-2 served some of them: its counts, printed as it stops
	if _, err := e.rt.StopContainer(context.Background(), &cri.StopContainerRequest{ContainerId: web2httpd, Timeout: 10}); err != nil {
		t.Fatal(err)
	}
	var counts struct {
		Answered uint64 `json:"responses_2xx"`
	}
	httpdOut := e.output(web2, web2httpd, "httpd", 30*time.Second)
	if len(httpdOut) == 0 || json.Unmarshal([]byte(httpdOut[len(httpdOut)-1]), &counts) != nil {
		t.Fatalf("web-2 printed no counts: %q", httpdOut)
	}
	if counts.Answered < 2 { // one is the node's probe
		t.Fatalf("web-2 answered nothing after it joined the Service: %v", counts)
	}
	t.Logf("%d calls by name, none failed, while web-0 left and web-2 joined; web-2 answered %d of them (and the node's probe)",
		ok, counts.Answered-1)
}

// inNetns runs a command in a named network namespace.
func inNetns(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + name, "--"}, args...)...)
}

// probe is kubelet's HTTP readiness probe of a pod, from the node: retried until it answers
// 200.
func (e *env) probe(netns, url string) {
	e.t.Helper()
	var last string
	err := waitFor("the node's HTTP probe of "+url, 30*time.Second, func() bool {
		o, _ := inNetns(netns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url).Output()
		last = string(o)
		return last == "200"
	})
	if err != nil {
		e.t.Fatalf("%v (last status %q)", err, last)
	}
}

// fileText is a file's text, or "" when it cannot be read.
func fileText(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
