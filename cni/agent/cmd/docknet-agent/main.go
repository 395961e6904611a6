// Command docknet-agent keeps this node's DockNet routes equal to the cluster's nodes: every
// other node's pod network through that node's address on the link the daemons drive. It
// watches the Node objects of the Kubernetes API (in the cluster, or through --kubeconfig), or
// reads a file of nodes (--nodes), and programs the node's daemon through its control socket.
// It restarts without disturbing traffic: routes already right are left as they are.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"docknet/cni/agent"
	"docknet/cni/internal/daemon"
	"docknet/cni/internal/install"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const usage = `usage: docknet-agent --cluster-cidr CIDR [--node-name NAME] [--kubeconfig FILE | --nodes FILE] [options]

Keeps this node's DockNet routes (docknet route ls) equal to the cluster: every other node's
IPv4 pod network (spec.podCIDRs) through that node's InternalIP address. Routes inside
--cluster-cidr are the agent's (added, changed and removed as the nodes change); routes
outside it are left alone.

With the Kubernetes API it also keeps the daemon's services (docknet service ls) equal to
the cluster's ClusterIP Services (--services, on by default): one per IPv4 ClusterIP and TCP
or UDP port, named k8s.NAMESPACE.NAME.PORT, its backends the endpoints of the Service's
EndpointSlices that this node's pods reach as kube-proxy chooses them: the ready ones (the
terminating ones still serving when none is ready), narrowed by the slices' hints for this
node or its zone (topology-aware routing), or this node's own for internalTrafficPolicy
Local. Services not named k8s.* are left alone.

Sources of nodes:
  (default)        the Kubernetes API from inside the cluster (a pod's service account)
  --kubeconfig F   the Kubernetes API through a kubeconfig file (also $KUBECONFIG)
  --nodes F        a JSON file: [{"name": "n1", "address": "192.168.1.11",
                   "podCIDRs": ["10.244.1.0/24"]}, ...], read again when it changes

Options:
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("docknet-agent", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
	}
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	clusterCIDR := fs.String("cluster-cidr", "", "the cluster's pod network, e.g. 10.244.0.0/16 (required)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default $KUBECONFIG; empty: in-cluster)")
	nodesFile := fs.String("nodes", "", "read the nodes from this JSON file instead of the Kubernetes API")
	socket := fs.String("socket", daemon.DefaultSocket, "the DockNet daemon's control socket")
	resync := fs.Duration("resync", 30*time.Second, "check the routes again this often without a change")
	cniConf := fs.String("cni-conf", "", "write DockNet's conflist here once this node's pod network is known, addresses handed out from it alone, and again when it changes (with docknet-cni-install --no-conf)")
	cniVersion := fs.String("cni-version", "1.0.0", "with --cni-conf: the conflist's cniVersion")
	mtu := fs.Uint("mtu", 1500, "with --cni-conf: the pipes' MTU")
	ipamDir := fs.String("ipam-data-dir", "", "with --cni-conf: host-local's lease directory (default its own, /var/lib/cni/networks)")
	devInfoDir := fs.String("device-info-dir", "", "with --cni-conf: where the plugin writes device-info files when the runtime names none (default /var/run/k8s.cni.cncf.io/devinfo/cni)")
	vxlan := fs.Int("vxlan", -1, "route the other nodes' pod networks through VXLAN tunnels to their addresses with this network identifier (0-16777215), for nodes that share no link; -1: on the link, through each node's address")
	routes := fs.Bool("routes", true, "keep the daemon's routes to the other nodes' pod networks; false where the daemon runs with --host-link (the node's own routes carry that traffic, and the daemon keeps none)")
	kernelRoutes := fs.Bool("kernel-routes", false, "also keep this node's own kernel routes to the other nodes' pod networks through their addresses (protocol 78, as flannel's host-gw does): the node's traffic to those pods, and nodes whose rp_filter is 1 need them to answer the daemons' ARP requests; not with --vxlan or --routes=false")
	services := fs.Bool("services", true, "with the Kubernetes API: keep the daemon's services equal to the cluster's ClusterIP Services and the endpoints this node's pods reach")
	once := fs.Bool("once", false, "reconcile once, print the changes and exit")
	jsonOut := fs.Bool("json", false, "with --once: print the changes as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "docknet-agent: "+format+"\n", a...)
		return 2
	}
	if *clusterCIDR == "" {
		return fail("--cluster-cidr is required (the cluster's pod network, e.g. 10.244.0.0/16)")
	}
	cluster, err := netip.ParsePrefix(*clusterCIDR)
	if err != nil || !cluster.Addr().Is4() || cluster.Masked() != cluster || cluster.Bits() < 8 {
		return fail("--cluster-cidr %q: want an IPv4 network of /8 or smaller with no host bits set, e.g. 10.244.0.0/16", *clusterCIDR)
	}
	if *vxlan < -1 || *vxlan > 1<<24-1 {
		return fail("--vxlan %d: a VXLAN network identifier is 0-16777215 (or -1 for none)", *vxlan)
	}
	for _, d := range []struct{ flag, dir string }{{"--ipam-data-dir", *ipamDir}, {"--device-info-dir", *devInfoDir}} {
		if d.dir != "" && (*cniConf == "" || !filepath.IsAbs(d.dir)) {
			return fail("%s %q: an absolute path, and only with --cni-conf (it goes into the conflist the agent writes)", d.flag, d.dir)
		}
	}
	if *kernelRoutes && (*vxlan >= 0 || !*routes) {
		return fail("--kernel-routes routes the other nodes' pods on the link the nodes share: not with --vxlan (no shared link) or --routes=false (the node's own routes carry that traffic)")
	}
	if *nodeName == "" {
		return fail("--node-name (or $NODE_NAME) is required: this node's own pod network is not routed")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var src agent.Source
	var svcSrc agent.ServiceSource
	if *nodesFile != "" {
		f := agent.NewFileSource(*nodesFile, 200*time.Millisecond)
		defer f.Close()
		src = f
	} else {
		var cfg *rest.Config
		if *kubeconfig != "" {
			cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
		} else {
			cfg, err = rest.InClusterConfig()
		}
		if err != nil {
			return fail("the Kubernetes API: %v (give --kubeconfig, or --nodes for a static file)", err)
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fail("the Kubernetes API: %v", err)
		}
		k, err := agent.NewKubeSource(ctx, client, *resync)
		if err != nil {
			return fail("%v", err)
		}
		src = k
		if *services {
			ks, err := agent.NewKubeServices(ctx, client, *resync, *nodeName)
			if err != nil {
				return fail("%v", err)
			}
			svcSrc = ks
		}
	}
	d := daemon.New(*socket)
	d.Timeout = 5 * time.Second
	logf := func(s string) {
		fmt.Fprintf(os.Stderr, "%s docknet-agent: %s\n", time.Now().UTC().Format(time.RFC3339), s)
	}
	c := agent.Config{Self: *nodeName, Cluster: cluster, Resync: *resync, Log: logf, NoRoutes: !*routes}
	if *vxlan >= 0 {
		v := uint32(*vxlan)
		c.Vxlan = &v
	}
	if *kernelRoutes {
		c.Kernel = agent.Netlink{}
	}
	if *cniConf != "" {
		c.OnSelf = cniWriter(*cniConf, cluster, *socket, *cniVersion, *mtu, confDirs{ipam: *ipamDir, devInfo: *devInfoDir}, logf)
	}
	if *once {
		pass, err := agent.Sync(c, src, d)
		if svcSrc != nil {
			sp, serr := agent.SyncServices(svcSrc, d, logf)
			pass.Skipped = append(pass.Skipped, sp.Skipped...)
			pass.Refused = append(pass.Refused, sp.Refused...)
			err = errors.Join(err, serr)
		}
		for _, l := range pass.Skipped {
			logf("skipped: " + l)
		}
		for _, l := range pass.Refused {
			logf("refused: " + l)
		}
		if *jsonOut {
			if pass.Changes == nil {
				pass.Changes = []agent.Change{}
			}
			b, _ := json.Marshal(pass.Changes)
			fmt.Println(string(b))
		}
		if err != nil {
			return fail("%v", err)
		}
		if len(pass.Refused) > 0 {
			return 1
		}
		return 0
	}
	logf(fmt.Sprintf("node %s, cluster %s, daemon %s, services %v", *nodeName, cluster, *socket, svcSrc != nil))
	if svcSrc != nil {
		sc := c
		sc.Log = func(s string) { logf("services: " + s) }
		go func() {
			if err := agent.RunServices(ctx, sc, svcSrc, d); err != nil && ctx.Err() == nil {
				logf(fmt.Sprintf("services: %v", err))
			}
		}()
	}
	if err := agent.Run(ctx, c, src, d); err != nil && ctx.Err() == nil {
		return fail("%v", err)
	}
	return 0
}

// confDirs are the directories the conflist names for the plugins' files ("": their defaults).
type confDirs struct{ ipam, devInfo string }

// cniWriter writes the conflist at path for this node's first IPv4 pod network (inside
// cluster), when it changes.
func cniWriter(path string, cluster netip.Prefix, socket, version string, mtu uint, dirs confDirs, logf func(string)) func(agent.Node) error {
	last := ""
	return func(n agent.Node) error {
		pod, why := agent.OwnPodNetwork(n, cluster)
		if why != "" {
			if last != why {
				logf(fmt.Sprintf("%s not written: %s", path, why))
				last = why
			}
			return nil
		}
		o := &install.Options{ConfDir: filepath.Dir(path), ConfName: filepath.Base(path), Network: "docknet",
			Subnet: cluster.String(), PodCIDR: pod.String(), DaemonSocket: socket, MTU: mtu, CNIVersion: version,
			IPAMDataDir: dirs.ipam, DevInfoDir: dirs.devInfo}
		if _, err := install.WriteConf(o); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if last != pod.String() {
			logf(fmt.Sprintf("%s: addresses from %s (this node's pod network)", path, pod))
			last = pod.String()
		}
		return nil
	}
}
