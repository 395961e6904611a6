// Package e2e drives docknet-cni the way kubelet does: through containerd's CRI
// (k8s.io/cri-api, the kubelet's own API package), against a containerd this test starts
// itself (private root, state and socket, in a network namespace of its own) with images it
// builds itself (a static pause binary, and dnperf with its libraries): nothing is pulled.
//
// Run by scripts/test.sh. Needs root, containerd (Debian's, 1.6, with its CRI plugin), runc,
// and the release build and bin/ of the checkout; without them it is skipped with the reason,
// unless DOCKNET_REQUIRE_CRI=1 (CI), where it fails.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	pauseImage = "docknet.test/pause:1"
	appImage   = "docknet.test/dnperf:1"
	podSubnet  = "10.76.0.0/24"
	// where the app image keeps DockNet's preload library
	preloadPath = "/libdocknet_preload.so"
)

// repo is the checkout's root (this package is cni/e2e).
func repo() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// skipOrFail skips with the reason, or fails where CI requires the test to run.
func skipOrFail(t *testing.T, format string, a ...any) {
	t.Helper()
	if os.Getenv("DOCKNET_REQUIRE_CRI") == "1" {
		t.Fatalf("cannot run (DOCKNET_REQUIRE_CRI=1): "+format, a...)
	}
	t.Skipf(format, a...)
}

type env struct {
	t *testing.T
	// whether /run/containerd was there before (containerd 1.6 puts its shims' sockets in
	// /run/containerd/s whatever its state directory)
	hadRunDir bool
	// whether /var/lib/cni was there (containerd's CNI library keeps its results cache there)
	hadCNICache bool
	dir         string
	netns       string // the namespace containerd runs in
	ownNetns    bool   // made by setup (removed at teardown)
	node        string // the node's name ("" for the one-node tests)
	agent       *exec.Cmd
	docknet     string // the docknet binary
	dnperf      string
	sock        string // docknet's control socket
	csock       string // containerd's
	daemon      *exec.Cmd
	ctrd        *exec.Cmd
	conn        *grpc.ClientConn
	rt          cri.RuntimeServiceClient
}

func (e *env) run(name string, args ...string) string {
	e.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func waitFor(what string, d time.Duration, ok func() bool) error {
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			return fmt.Errorf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func socketUp(p string) bool {
	c, err := net.Dial("unix", p)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// pipes lists the daemon's pipes.
func (e *env) pipes() []map[string]any {
	e.t.Helper()
	var ps []map[string]any
	if err := json.Unmarshal([]byte(e.run(e.docknet, "--socket", e.sock, "pipe", "ls", "--json")), &ps); err != nil {
		e.t.Fatal(err)
	}
	return ps
}

// mountsUnder lists mount points whose path contains any of the given strings.
func mountsUnder(subs ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		for _, s := range subs {
			if strings.Contains(fields[4], s) {
				out = append(out, fields[4])
			}
		}
	}
	return out
}

func netnsEntries() map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir("/var/run/netns")
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

func stop(c *exec.Cmd, d time.Duration) {
	if c == nil || c.Process == nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		_ = c.Process.Kill()
		<-done
	}
}

// nodeOpts make setup build one node of several.
type nodeOpts struct {
	// name of the node (its files, its cgroups, the agent's --node-name)
	name string
	// netns is the node's own network namespace, where its daemon and containerd run (made by
	// the caller, with its end of the wire)
	netns string
	// daemon: the daemon's arguments beyond its directory and socket
	daemon []string
	// agent: docknet-agent's arguments beyond the node's name, the socket and the conflist;
	// the agent writes the conflist (the installer copies binaries only)
	agent []string
}

// setup starts the daemon and containerd and imports the images.
func setup(t *testing.T) *env {
	return setupNode(t, nodeOpts{daemon: []string{"--idle", "spin", "--master-cores", "0"}})
}

// setupNode starts a node: its daemon, its node agent when asked, its containerd, its images.
func setupNode(t *testing.T, o nodeOpts) *env {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root (namespaces, containerd)")
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "ip", "ldd", "curl", "getent", "sh"} {
		if _, err := exec.LookPath(b); err != nil {
			skipOrFail(t, "%s not installed (scripts/setup.sh installs containerd and runc with apt-get)", b)
		}
	}
	r := repo()
	target := os.Getenv("DOCKNET_TARGET")
	if target == "" {
		target = filepath.Join(r, "target", "release")
	}
	e := &env{t: t, docknet: filepath.Join(target, "docknet"), dnperf: filepath.Join(target, "dnperf")}
	e.hadRunDir = dirExists("/run/containerd")
	e.hadCNICache = dirExists("/var/lib/cni")
	bins := []string{e.docknet, e.dnperf, filepath.Join(target, "docknet-httpd"), filepath.Join(target, "libdocknet_preload.so"),
		filepath.Join(r, "bin", "docknet-cni"), filepath.Join(r, "bin", "docknet-cni-install"),
		filepath.Join(r, "bin", "host-local"), filepath.Join(r, "bin", "loopback")}
	if o.agent != nil {
		bins = append(bins, filepath.Join(r, "bin", "docknet-agent"))
	}
	for _, b := range bins {
		if _, err := os.Stat(b); err != nil {
			skipOrFail(t, "%s missing: run scripts/setup.sh (cargo build --release and the CNI plugins)", b)
		}
	}
	dir, err := os.MkdirTemp("", "dncri-"+o.name)
	if err != nil {
		t.Fatal(err)
	}
	e.dir = dir
	e.node = o.name
	e.netns, e.ownNetns = o.netns, o.netns == ""
	if e.ownNetns {
		e.netns = fmt.Sprintf("dncri-%d", os.Getpid())
	}
	t.Cleanup(e.teardown)

	// the daemon (the one-node tests: master on core 0, as the lab's docknet mode), in the
	// node's namespace when it has one
	e.sock = filepath.Join(dir, "docknet.sock")
	args := append([]string{e.docknet, "--log", "warn", "daemon", "--run-dir", filepath.Join(dir, "docknet"),
		"--socket", e.sock, "--ephemeral"}, o.daemon...)
	if !e.ownNetns {
		args = append([]string{"nsenter", "--net=/var/run/netns/" + e.netns}, args...)
	}
	e.daemon = exec.Command(args[0], args[1:]...)
	e.daemon.Stderr = os.Stderr
	if err := e.daemon.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor("docknet daemon", 10*time.Second, func() bool { return socketUp(e.sock) }); err != nil {
		t.Fatal(err)
	}

	// the plugin and its configuration, installed as the DaemonSet's init container does
	install := []string{"--from", filepath.Join(r, "bin"),
		"--bin-dir", filepath.Join(dir, "cni-bin"), "--conf-dir", filepath.Join(dir, "cni-conf"),
		"--plugins", "docknet-cni,host-local,loopback", "--daemon-socket", e.sock, "--subnet", podSubnet,
		"--ipam-data-dir", filepath.Join(dir, "ipam"), "--device-info-dir", filepath.Join(dir, "devinfo")}
	if o.agent != nil {
		install = append(install, "--no-conf")
	}
	e.run(filepath.Join(r, "bin", "docknet-cni-install"), install...)
	if o.agent != nil {
		// the node agent writes the conflist for the node's pod network, and routes
		conf := filepath.Join(dir, "cni-conf", "10-docknet.conflist")
		e.agent = exec.Command(filepath.Join(r, "bin", "docknet-agent"), append([]string{"--node-name", o.name,
			"--socket", e.sock, "--cni-conf", conf, "--ipam-data-dir", filepath.Join(dir, "ipam"),
			"--device-info-dir", filepath.Join(dir, "devinfo")}, o.agent...)...)
		e.agent.Stderr = os.Stderr
		if err := e.agent.Start(); err != nil {
			t.Fatal(err)
		}
		if err := waitFor("the agent's conflist", 10*time.Second, func() bool { _, err := os.Stat(conf); return err == nil }); err != nil {
			t.Fatal(err)
		}
	}

	// containerd, in a network namespace of its own (or the node's)
	if e.ownNetns {
		e.run("ip", "netns", "add", e.netns)
	}
	e.csock = filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # never below containerd's own OOM score (lowering it needs CAP_SYS_RESOURCE, which
  # sandboxes such as CI machines withhold)
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[9]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), e.csock, e.csock+".ttrpc",
		filepath.Join(dir, "opt"), pauseImage, filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf"),
		filepath.Join(dir, "runc"))
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.ctrd = exec.Command("nsenter", "--net=/var/run/netns/"+e.netns, "containerd", "--config", filepath.Join(dir, "containerd.toml"))
	e.ctrd.Stdout, e.ctrd.Stderr = logf, logf
	if err := e.ctrd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor("containerd", 30*time.Second, func() bool { return socketUp(e.csock) }); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
		skipOrFail(t, "containerd cannot run here: %v\n%s", err, tail(string(log), 20))
	}
	e.conn, err = grpc.NewClient("unix://"+e.csock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.rt = cri.NewRuntimeServiceClient(e.conn)
	if err := waitFor("the CRI plugin", 30*time.Second, func() bool {
		st, err := e.rt.Status(context.Background(), &cri.StatusRequest{})
		if err != nil {
			return false
		}
		for _, c := range st.Status.Conditions {
			if !c.Status {
				return false
			}
		}
		return true
	}); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
		skipOrFail(t, "containerd's CRI plugin is not ready here: %v\n%s", err, tail(string(log), 20))
	}
	e.images()
	return e
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// images builds the pause and app images and imports them for the CRI (namespace k8s.io).
func (e *env) images() {
	t := e.t
	pause := filepath.Join(e.dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", pause, "./pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building pause: %v\n%s", err, out)
	}
	// dnperf and docknet-httpd (DockLib programs), and unmodified programs for the preload
	// library (a shell, curl, getent), each with the libraries it loads
	target := filepath.Dir(e.docknet)
	var files []file
	seen := map[string]bool{}
	host := func(name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, f := range []file{
		{dst: "/dnperf", src: e.dnperf}, {dst: "/docknet-httpd", src: filepath.Join(target, "docknet-httpd")},
		{dst: "/bin/sh", src: host("sh")}, {dst: "/curl", src: host("curl")}, {dst: "/getent", src: host("getent")},
		{dst: preloadPath, src: filepath.Join(target, "libdocknet_preload.so")},
	} {
		libs, err := sharedLibs(f.src)
		if err != nil {
			t.Fatal(err)
		}
		f.mode = 0o755
		files = append(files, f)
		for _, l := range libs {
			if !seen[l] {
				seen[l] = true
				files = append(files, file{dst: l, src: l, mode: 0o755})
			}
		}
	}
	for _, img := range []struct {
		name  string
		files []file
		cmd   []string
	}{
		{pauseImage, []file{{dst: "/pause", src: pause, mode: 0o755}}, []string{"/pause"}},
		{appImage, files, []string{"/dnperf", "--help"}},
	} {
		layer, err := layerTar(img.files)
		if err != nil {
			t.Fatal(err)
		}
		archive, err := ociArchive(img.name, layer, img.cmd)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(e.dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.name)+".tar")
		if err := os.WriteFile(p, archive, 0o600); err != nil {
			t.Fatal(err)
		}
		e.run("ctr", "--address", e.csock, "--namespace", "k8s.io", "images", "import", "--platform", "linux/amd64", p)
	}
}

// cgroupParent is the pods' cgroup parent, in every hierarchy.
func (e *env) cgroupParent() string { return fmt.Sprintf("/dncri-%d%s", os.Getpid(), e.node) }

// removeCgroups removes the pods' cgroup parent (empty once the containers are gone) from
// every hierarchy.
func (e *env) removeCgroups() {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(e.cgroupParent(), "/")))
	if d := filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(e.cgroupParent(), "/")); dirExists(d) {
		dirs = append(dirs, d) // cgroup v2
	}
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func (e *env) teardown() {
	if e.rt != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if l, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
			for _, p := range l.Items {
				_, _ = e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id})
				_, _ = e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id})
			}
		}
		cancel()
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
	stop(e.ctrd, 20*time.Second)
	e.removeCgroups()
	stop(e.agent, 5*time.Second)
	stop(e.daemon, 10*time.Second)
	if b, err := os.ReadFile(filepath.Join(e.dir, "docknet", "holder.pid")); err == nil {
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if e.ownNetns {
		_ = exec.Command("ip", "netns", "del", e.netns).Run()
	}
	// what a crashed run may have left mounted under its directory
	left := mountsUnder(e.dir)
	sort.Sort(sort.Reverse(sort.StringSlice(left)))
	for _, m := range left {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	// only if empty: no shim and no cached result of anyone's is left
	if !e.hadRunDir {
		_ = os.Remove("/run/containerd/s")
		_ = os.Remove("/run/containerd")
	}
	if !e.hadCNICache {
		_ = os.Remove("/var/lib/cni/results")
		_ = os.Remove("/var/lib/cni")
	}
	if os.Getenv("DOCKNET_CRI_KEEP") == "" { // keep containerd's log and state to debug
		_ = os.RemoveAll(e.dir)
	}
}

type pod struct {
	id, ip, logDir string
	cfg            *cri.PodSandboxConfig
}

// runPod is kubelet's RunPodSandbox, then the sandbox's address from its status.
func (e *env) runPod(name string, annotations map[string]string) *pod {
	return e.runPodDNS(name, annotations, nil)
}

// runPodDNS is runPod for a pod with the cluster's DNS settings (kubelet's dnsPolicy
// ClusterFirst): the runtime writes them as the pod's /etc/resolv.conf.
func (e *env) runPodDNS(name string, annotations map[string]string, dns *cri.DNSConfig) *pod {
	t := e.t
	p := &pod{logDir: filepath.Join(e.dir, "logs", name)}
	if err := os.MkdirAll(p.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.cfg = &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "docknet-e2e", Uid: fmt.Sprintf("uid-%s-%d", name, os.Getpid())},
		Hostname:     name,
		LogDirectory: p.logDir,
		Annotations:  annotations,
		DnsConfig:    dns,
		Linux: &cri.LinuxPodSandboxConfig{
			// runc leaves the parent of the containers' cgroups: one of the test's own, removed
			// at the end
			CgroupParent: e.cgroupParent(),
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD},
			}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: p.cfg})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(e.dir, "containerd.log"))
		t.Fatalf("RunPodSandbox %s: %v\n%s", name, err, tail(string(log), 15))
	}
	p.id = r.PodSandboxId
	st, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatal(err)
	}
	p.ip = st.Status.GetNetwork().GetIp()
	if p.ip == "" {
		t.Fatalf("pod %s has no address", name)
	}
	return p
}

// start is kubelet's CreateContainer and StartContainer.
func (e *env) start(p *pod, name string, cmd []string) string {
	return e.startWith(p, name, cmd, nil, nil)
}

// startWith is start with environment variables and mounts of host directories.
func (e *env) startWith(p *pod, name string, cmd []string, envs map[string]string, mounts []*cri.Mount) string {
	t := e.t
	var kvs []*cri.KeyValue
	for k, v := range envs {
		kvs = append(kvs, &cri.KeyValue{Key: k, Value: []byte(v)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: p.id,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: name},
			Image:    &cri.ImageSpec{Image: appImage},
			Command:  cmd,
			Envs:     kvs,
			Mounts:   mounts,
			LogPath:  name + ".log",
			// what kubelet gives a container with a CPU request of one core, on core 1 (the
			// lab's placement; the static CPU manager gives such pods cores of their own)
			Linux: &cri.LinuxContainerConfig{Resources: &cri.LinuxContainerResources{
				CpuShares: 1024, CpusetCpus: "1",
			}},
		},
		SandboxConfig: p.cfg,
	})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", name, err)
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("StartContainer %s: %v", name, err)
	}
	return c.ContainerId
}

// removePod is kubelet's StopPodSandbox and RemovePodSandbox.
func (e *env) removePod(p *pod) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		e.t.Fatal(err)
	}
}

// output waits for a container to exit and returns its stdout lines (from the CRI log file).
func (e *env) output(p *pod, id, name string, within time.Duration) []string {
	t := e.t
	var st *cri.ContainerStatus
	err := waitFor("container "+name, within, func() bool {
		r, err := e.rt.ContainerStatus(context.Background(), &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return false
		}
		st = r.Status
		return st.State == cri.ContainerState_CONTAINER_EXITED
	})
	b, _ := os.ReadFile(filepath.Join(p.logDir, name+".log"))
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, b)
	}
	if st.ExitCode != 0 {
		t.Fatalf("container %s exited %d; log:\n%s", name, st.ExitCode, b)
	}
	return stdoutLines(string(b))
}

// stdoutLines are the stdout lines of a CRI log (TIMESTAMP STREAM TAG CONTENT, a long line
// cut into partial (P) pieces ended by a full (F) one); a line still being written is left out.
func stdoutLines(log string) []string {
	var out []string
	var part strings.Builder
	for _, l := range strings.Split(log, "\n") {
		f := strings.SplitN(l, " ", 4)
		if len(f) != 4 || f[1] != "stdout" {
			continue
		}
		part.WriteString(f[3])
		if f[2] == "F" {
			out = append(out, part.String())
			part.Reset()
		}
	}
	return out
}

type clientReport struct {
	Result struct {
		Transactions uint64 `json:"transactions"`
		OneWayNs     struct {
			P50 uint64 `json:"p50"`
			P99 uint64 `json:"p99"`
		} `json:"one_way_ns"`
	} `json:"result"`
}

func lastJSON(t *testing.T, lines []string) clientReport {
	t.Helper()
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "{") {
			var r clientReport
			if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("no JSON in %q", lines)
	return clientReport{}
}

// rrArgs is the lab's 64-byte ping-pong through the daemon: the master spins on core 0, client
// and server share core 1 and yield when idle (the lab's `docknet` placement).
func rrArgs(dnperf, to string) []string {
	return []string{dnperf, "client", "--stack", "docknet", "--idle", "adaptive:0", "--cpu", "1", "--connect", to,
		"--workload", "rr", "--size", "64", "--duration", "2", "--warmup", "0.5", "--json"}
}

// baseline measures the lab's docknet mode on the same daemon: two `docknet run` containers.
func (e *env) baseline() clientReport {
	t := e.t
	e.run(e.docknet, "--socket", e.sock, "pipe", "create", "base-s", "--ip", "10.77.0.2/24")
	e.run(e.docknet, "--socket", e.sock, "pipe", "create", "base-c", "--ip", "10.77.0.3/24")
	srv := exec.Command(e.docknet, "--socket", e.sock, "run", "--pipe", "base-s", "--", e.dnperf, "server",
		"--stack", "docknet", "--idle", "adaptive:0", "--cpu", "1", "--bind", "10.77.0.2:5000", "--conns", "1")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(srv, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	out, err := exec.Command(e.docknet, append([]string{"--socket", e.sock, "run", "--pipe", "base-c", "--"},
		rrArgs(e.dnperf, "10.77.0.2:5000")...)...).Output()
	if err != nil {
		t.Fatalf("baseline client: %v", err)
	}
	r := lastJSON(t, strings.Split(string(out), "\n"))
	stop(srv, 5*time.Second)
	e.run(e.docknet, "--socket", e.sock, "pipe", "rm", "base-s")
	e.run(e.docknet, "--socket", e.sock, "pipe", "rm", "base-c")
	return r
}

func TestCRIPodsGetPipesExchangeTCPAtDockNetLatencyAndLeaveNothing(t *testing.T) {
	nsBefore := netnsEntries()
	e := setup(t)

	base := e.baseline()

	// the server and a third pod ask for a fast channel to each other (pod annotations, which
	// containerd hands the plugin as runtimeConfig); the client asks for none, so its traffic
	// to the server goes through the daemon
	fc := "docknet.io/fast-channel-peers"
	server := e.runPod("server", map[string]string{fc: "peer"})
	client := e.runPod("client", nil)
	peer := e.runPod("peer", map[string]string{fc: "server"})
	// each sandbox has a pipe named after it, attached in its namespace, address = pod IP
	byName := map[string]map[string]any{}
	for _, p := range e.pipes() {
		byName[p["name"].(string)] = p
	}
	if chans, _ := byName[server.id]["fast_channels"].([]any); len(chans) != 1 || chans[0] != peer.id {
		t.Fatalf("server's fast channels %v, want the peer's pipe %s", byName[server.id]["fast_channels"], peer.id)
	}
	if chans, _ := byName[client.id]["fast_channels"].([]any); len(chans) != 0 {
		t.Fatalf("the client asked for no fast channel, has %v", chans)
	}
	if byName[server.id]["labels"].(map[string]any)["k8s.io/pod"] != "docknet-e2e/server" {
		t.Fatalf("server's pipe labels %v", byName[server.id]["labels"])
	}
	for _, p := range []*pod{server, client, peer} {
		pipe, ok := byName[p.id]
		if !ok {
			t.Fatalf("no pipe named after sandbox %s: %v", p.id, byName)
		}
		if ip := strings.Split(pipe["ip"].(string), "/")[0]; ip != p.ip {
			t.Fatalf("pipe %s has %s, the pod %s", p.id, ip, p.ip)
		}
		if pipe["socket"] != "@docknet/pipe" {
			t.Fatalf("pipe %s not attached: %v", p.id, pipe)
		}
	}

	e.start(server, "server", []string{"/dnperf", "server", "--stack", "docknet", "--idle", "adaptive:0", "--cpu", "1",
		"--bind", server.ip + ":5000"})
	time.Sleep(300 * time.Millisecond)
	args := rrArgs("/dnperf", server.ip+":5000")
	id := e.start(client, "client", args)
	got := lastJSON(t, e.output(client, id, "client", 60*time.Second))
	t.Logf("64 B ping-pong one-way p50: CRI pods %.2f us (p99 %.2f us, %d transactions); docknet run containers on the same daemon %.2f us",
		float64(got.Result.OneWayNs.P50)/1e3, float64(got.Result.OneWayNs.P99)/1e3, got.Result.Transactions,
		float64(base.Result.OneWayNs.P50)/1e3)
	if got.Result.Transactions < 1000 {
		t.Fatalf("only %d transactions between the pods", got.Result.Transactions)
	}
	// The target is twice docknet's latency; measured here: 1.5-2.4x when `docknet run`
	// containers took 2.9-4.7 us, 2.2-3.2x since they take 2.0-3.0 us and the pods 4.8-6.5
	// (docs/benchmarks.md, not explained yet: not the pods' cgroups). The bound catches what
	// would be a broken path (a fallback, a stall: milliseconds), not the last factor of the
	// target, which is the benchmark's to measure.
	if got.Result.OneWayNs.P50 > 5*base.Result.OneWayNs.P50 {
		t.Fatalf("pods' p50 %d ns is more than five times docknet's %d ns", got.Result.OneWayNs.P50, base.Result.OneWayNs.P50)
	}

	// kubelet's teardown: StopPodSandbox (DEL), RemovePodSandbox
	for _, p := range []*pod{client, server, peer} {
		e.removePod(p)
	}
	if ps := e.pipes(); len(ps) != 0 {
		t.Fatalf("pipes left after the pods went: %v", ps)
	}
	for n := range netnsEntries() {
		if !nsBefore[n] && n != e.netns {
			t.Fatalf("network namespace %s left behind", n)
		}
	}
	if m := mountsUnder(e.dir, "/run/containerd/io.containerd"); len(m) != 0 {
		t.Fatalf("mounts left behind: %v", m)
	}
	if left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(e.cgroupParent(), "/"), "*", "tasks")); len(left) != 0 {
		t.Fatalf("containers' cgroups left behind: %v", left)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "devinfo")); len(ents) != 0 {
		t.Fatalf("device-info files left behind: %v", ents)
	}
}
