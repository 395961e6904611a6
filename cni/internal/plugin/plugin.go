// Package plugin is docknet-cni: a CNI plugin (spec 1.1: ADD, DEL, CHECK, STATUS, GC, VERSION)
// that gives a pod a DockPipe. The daemon creates the pipe and binds its abstract socket
// (`@docknet/pipe`) in the pod's network namespace; DockLib in the pod finds it there with no
// configuration. Addresses come from a delegated IPAM plugin (host-local). The plugin runs
// standalone (the pipe is the pod's network) or chained after a kernel plugin such as bridge
// (the pod keeps eth0 and gets the pipe beside it).
//
// A pipe is named after the container ID and carries labels (owner, network, interface, pod,
// fast-channel peers) in the daemon's state, so DEL, CHECK and GC act only on the pipes this
// plugin made for that network, and find them again after a daemon restart.
package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"docknet/cni/internal/daemon"
)

// Funcs are the plugin's verbs for skel.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: wrap(Add), Del: wrap(Del), Check: wrap(Check), GC: wrap(GC), Status: wrap(Status)}
}

// wrap gives every error its CNI code.
func wrap(f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(a *skel.CmdArgs) error {
		if err := f(a); err != nil {
			return ToCNI(err)
		}
		return nil
	}
}

// pipeName is the pipe of an attachment: the container ID (checked against the daemon's rule).
func pipeName(containerID string) (string, error) {
	if len(containerID) > MaxContainerID {
		return "", &EnvError{Msg: fmt.Sprintf("CNI_CONTAINERID is %d bytes; DockNet names pipes after container IDs of at most %d", len(containerID), MaxContainerID)}
	}
	return containerID, nil
}

// ours says whether p is this plugin's pipe for network and (when not empty) ifName.
func ours(p *daemon.Pipe, network, ifName string) bool {
	return p.Labels[LabelOwner] == OwnerValue && p.Labels[LabelNetwork] == network &&
		(ifName == "" || p.Labels[LabelIfName] == ifName)
}

func checkNetns(path string) error {
	if err := ns.IsNSorErr(path); err != nil {
		return &EnvError{Msg: fmt.Sprintf("CNI_NETNS %q: %v", path, err)}
	}
	return nil
}

// firstIPv4 is the first IPv4 address of an IPAM result.
func firstIPv4(r *current.Result) (*current.IPConfig, error) {
	for _, ip := range r.IPs {
		if ip.Address.IP.To4() != nil {
			return ip, nil
		}
	}
	return nil, newErr(ErrNoIPv4, "IPAM plugin gave no IPv4 address (a DockNet pipe needs one; IPv6 comes beside it)")
}

// firstIPv6 is the first IPv6 address of an IPAM result, or nil: a dual-stack pipe gets it.
func firstIPv6(r *current.Result) *current.IPConfig {
	for _, ip := range r.IPs {
		if ip.Address.IP.To4() == nil && ip.Address.IP.To16() != nil {
			return ip
		}
	}
	return nil
}

// Add creates the pipe, binds its socket in the pod's namespace, sets its limits, builds the
// fast channels the pod and its peers asked for, writes the device-info file and prints the
// result. A step that fails undoes the ones before it.
func Add(args *skel.CmdArgs) (err error) {
	tm := newTimer()
	defer tm.report("ADD")
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	name, err := pipeName(args.ContainerID)
	if err != nil {
		return err
	}
	if err := checkNetns(args.Netns); err != nil {
		return err
	}
	pod, err := ParseArgs(args.Args)
	if err != nil {
		return err
	}
	peers, err := FastChannelPeers(conf, pod)
	if err != nil {
		return err
	}
	devPath, err := DeviceInfoPath(conf, args.ContainerID, args.IfName)
	if err != nil {
		return err
	}
	client := daemon.New(conf.DaemonSocket)

	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	// a pipe already there (a second ADD of the attachment, or another interface of the
	// container) is refused before IPAM is asked: undoing that lease would take the address
	// of the pipe that lives
	switch old, err := client.PipeShow(name); {
	case err == nil:
		return newErr(ErrPipeExists, "container %s already has a DockNet pipe (network %q, interface %q); a pod gets one pipe",
			name, old.Labels[LabelNetwork], old.Labels[LabelIfName])
	case !daemon.IsCode(err, daemon.CodeNotFound):
		return err
	}
	tm.step("check")
	r, err := invoke.DelegateAdd(context.TODO(), conf.IPAM.Type, args.StdinData, nil)
	if err != nil {
		return err
	}
	tm.step("ipam")
	undo = append(undo, func() { _ = invoke.DelegateDel(context.TODO(), conf.IPAM.Type, args.StdinData, nil) })
	ipamRes, err := current.NewResultFromResult(r)
	if err != nil {
		return fmt.Errorf("IPAM result: %w", err)
	}
	addr, err := firstIPv4(ipamRes)
	if err != nil {
		return err
	}

	labels := map[string]string{
		LabelOwner:   OwnerValue,
		LabelNetwork: conf.Name,
		LabelIfName:  args.IfName,
		LabelDevInfo: devPath,
	}
	if pod != nil {
		labels[LabelPod] = pod.String()
	}
	if len(peers) > 0 {
		labels[LabelPeers] = strings.Join(peers, ",")
	}
	addr6 := firstIPv6(ipamRes)
	cidr6 := ""
	if addr6 != nil {
		cidr6 = addr6.Address.String()
	}
	pipe, err := client.PipeCreate(name, addr.Address.String(), cidr6, conf.MTU, labels)
	if err != nil {
		return err
	}
	undo = append(undo, func() { _ = client.PipeRm(name) })
	tm.step("pipe_create")

	if err := client.PipeAttach(name, args.Netns, conf.SocketName); err != nil {
		return err
	}
	tm.step("pipe_attach")
	if rc := conf.RuntimeConfig; rc != nil && rc.Bandwidth != nil {
		if err := setLimits(client, name, rc.Bandwidth); err != nil {
			return err
		}
	}
	if len(peers) > 0 {
		if err := connectPeers(client, name, pod, peers); err != nil {
			return err
		}
	}
	socketPath := "@" + conf.SocketName
	rec := &DeviceInfo{Type: "memif", Version: DeviceInfoVersion,
		Memif: &MemifInfo{Role: "slave", Path: socketPath, Mode: "ethernet"}}
	if err := WriteDeviceInfo(devPath, rec); err != nil {
		return newErr(ErrDeviceInfo, "%v", err)
	}
	undo = append(undo, func() { _ = RemoveDeviceInfo(devPath) })
	tm.step("limits_channels_devinfo")

	iface := &current.Interface{Name: args.IfName, Mac: pipe.MAC, Mtu: int(pipe.MTU), Sandbox: args.Netns, SocketPath: socketPath}
	ipc := &current.IPConfig{Address: addr.Address, Gateway: addr.Gateway}
	var result *current.Result
	if conf.Prev == nil {
		ipc.Interface = current.Int(0)
		ips := []*current.IPConfig{ipc}
		if addr6 != nil {
			ips = append(ips, &current.IPConfig{Address: addr6.Address, Gateway: addr6.Gateway, Interface: current.Int(0)})
		}
		result = &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: []*current.Interface{iface},
			IPs: ips, Routes: ipamRes.Routes, DNS: ipamRes.DNS}
		if len(conf.DNS.Nameservers) > 0 {
			result.DNS = conf.DNS
		}
	} else {
		// chained: the previous plugin made CNI_IFNAME; the pipe is a second network beside
		// it. Its address stays out of "ips": the reference plugins' CHECK (bridge's) requires
		// every address of the result on CNI_IFNAME. The pod learns it from its pipe.
		result = conf.Prev
		iface.Name = ChainedInterface
		result.Interfaces = append(result.Interfaces, iface)
	}
	return types.PrintResult(result, conf.CNIVersion)
}

func setLimits(c *daemon.Client, name string, bw *Bandwidth) error {
	opt := func(v uint64) *uint64 {
		if v == 0 {
			return nil
		}
		return &v
	}
	if bw.EgressRate == 0 && bw.IngressRate == 0 {
		return nil
	}
	_, err := c.RateSet(name, opt(bw.EgressRate), opt(bw.IngressRate), opt(bw.EgressBurst), opt(bw.IngressBurst))
	return err
}

// connectPeers builds a fast channel to each pipe whose pod this pod names and that names
// this pod back: both partners must ask (a channel bypasses the daemon and its limits).
func connectPeers(c *daemon.Client, name string, pod *Pod, peers []string) error {
	want := map[string]bool{}
	for _, p := range peers {
		want[p] = true
	}
	all, err := c.PipeLs()
	if err != nil {
		return err
	}
	for i := range all {
		p := &all[i]
		if p.Name == name || p.Labels[LabelOwner] != OwnerValue || !want[p.Labels[LabelPod]] {
			continue
		}
		if !contains(strings.Split(p.Labels[LabelPeers], ","), pod.String()) {
			continue // it did not ask for us (yet): the channel is built when it does
		}
		if contains(p.FastChannels, name) {
			continue
		}
		if err := c.FcConnect(name, p.Name); err != nil {
			return newErr(ErrFastChannel, "fast channel to pod %s (pipe %s): %v", p.Labels[LabelPod], p.Name, err)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Del removes the attachment's pipe (if it is this plugin's, for this network and interface),
// its device-info file and its address. Idempotent: what is already gone is not an error, and
// neither is an empty or missing prevResult. A daemon that does not answer is (try again
// later, 11), and nothing is released then, so the address is never handed out while its pipe
// may still live.
func Del(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	name, err := pipeName(args.ContainerID)
	if err != nil {
		return err
	}
	client := daemon.New(conf.DaemonSocket)
	devPath, _ := DeviceInfoPath(conf, args.ContainerID, args.IfName)
	p, err := client.PipeShow(name)
	switch {
	case daemon.IsCode(err, daemon.CodeNotFound):
	case err != nil:
		return err
	case ours(p, conf.Name, args.IfName):
		if err := client.PipeRm(name); err != nil && !daemon.IsCode(err, daemon.CodeNotFound) {
			return err
		}
		if l := p.Labels[LabelDevInfo]; l != "" {
			devPath = l
		}
	}
	if devPath != "" && deviceInfoPathAllowed(conf, devPath) {
		if err := RemoveDeviceInfo(devPath); err != nil {
			return newErr(ErrDeviceInfo, "%v", err)
		}
	}
	return invoke.DelegateDel(context.TODO(), conf.IPAM.Type, args.StdinData, nil)
}

// deviceInfoPathAllowed re-checks a path read back from a label before removing it.
func deviceInfoPathAllowed(conf *NetConf, p string) bool {
	c := *conf
	c.RuntimeConfig = &RuntimeConfig{DeviceInfoFile: p}
	got, err := DeviceInfoPath(&c, "", "")
	return err == nil && got == p
}

// Check verifies that the attachment is as ADD left it: the pipe exists and is this plugin's,
// it has the address and socket the result names, its limits are the configured ones, the
// namespace still exists, and IPAM agrees.
func Check(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if conf.Prev == nil {
		return configErr("CHECK needs the prevResult of ADD")
	}
	name, err := pipeName(args.ContainerID)
	if err != nil {
		return err
	}
	if err := checkNetns(args.Netns); err != nil {
		return err
	}
	client := daemon.New(conf.DaemonSocket)
	p, err := client.PipeShow(name)
	if daemon.IsCode(err, daemon.CodeNotFound) {
		return newErr(ErrNoPipe, "container %s has no DockNet pipe", name)
	}
	if err != nil {
		return err
	}
	if !ours(p, conf.Name, args.IfName) {
		return newErr(ErrMismatch, "pipe %s is not docknet-cni's for network %q, interface %q", name, conf.Name, args.IfName)
	}
	socketPath := "@" + conf.SocketName
	idx := -1
	for i, ifc := range conf.Prev.Interfaces {
		if ifc.SocketPath == socketPath && ifc.Sandbox == args.Netns {
			idx = i
		}
	}
	if idx < 0 {
		return newErr(ErrMismatch, "prevResult names no interface with socket %s in %s", socketPath, args.Netns)
	}
	if !strings.EqualFold(conf.Prev.Interfaces[idx].Mac, p.MAC) {
		return newErr(ErrMismatch, "pipe %s has MAC %s, the result says %s", name, p.MAC, conf.Prev.Interfaces[idx].Mac)
	}
	var addr, addr6 *net.IPNet
	for _, ip := range conf.Prev.IPs {
		if ip.Interface != nil && *ip.Interface == idx {
			a := ip.Address
			if a.IP.To4() != nil {
				addr = &a
			} else {
				addr6 = &a
			}
		}
	}
	if (addr == nil && conf.Prev.Interfaces[idx].Name != ChainedInterface) || (addr != nil && addr.String() != p.IP) {
		return newErr(ErrMismatch, "pipe %s has address %s, the result says %v", name, p.IP, addr)
	}
	// a dual-stack pipe's IPv6 address is in the result as its IPv4 one is (not when chained)
	if addr != nil && ((addr6 == nil && p.IP6 != "") || (addr6 != nil && addr6.String() != p.IP6)) {
		return newErr(ErrMismatch, "pipe %s has IPv6 address %q, the result says %v", name, p.IP6, addr6)
	}
	if p.Socket == nil || *p.Socket != socketPath {
		return newErr(ErrMismatch, "pipe %s is not attached at %s in its namespace", name, socketPath)
	}
	if err := checkLimits(client, name, conf); err != nil {
		return err
	}
	return invoke.DelegateCheck(context.TODO(), conf.IPAM.Type, args.StdinData, nil)
}

func checkLimits(c *daemon.Client, name string, conf *NetConf) error {
	var want Bandwidth
	if conf.RuntimeConfig != nil && conf.RuntimeConfig.Bandwidth != nil {
		want = *conf.RuntimeConfig.Bandwidth
	}
	got, err := c.RateShow(name)
	if err != nil {
		return err
	}
	val := func(v *uint64) uint64 {
		if v == nil {
			return 0
		}
		return *v
	}
	if val(got.EgressBps) != want.EgressRate || val(got.IngressBps) != want.IngressRate {
		return newErr(ErrMismatch, "pipe %s is limited to egress %d, ingress %d bit/s; the configuration says %d, %d",
			name, val(got.EgressBps), val(got.IngressBps), want.EgressRate, want.IngressRate)
	}
	return nil
}

// GC removes every pipe this plugin made for this network whose attachment is not among
// cni.dev/valid-attachments (other networks' pipes and pipes made by others are left alone),
// with their device-info files, then lets IPAM collect its own. It carries on past a failed
// removal and reports the first failure at the end.
func GC(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[[2]string]bool{}
	for _, a := range conf.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
	}
	client := daemon.New(conf.DaemonSocket)
	pipes, err := client.PipeLs()
	if err != nil {
		return err
	}
	var first error
	for i := range pipes {
		p := &pipes[i]
		if !ours(p, conf.Name, "") || valid[[2]string{p.Name, p.Labels[LabelIfName]}] {
			continue
		}
		if err := client.PipeRm(p.Name); err != nil && !daemon.IsCode(err, daemon.CodeNotFound) {
			if first == nil {
				first = err
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "docknet-cni: GC removed pipe %s (interface %s)\n", p.Name, p.Labels[LabelIfName])
		// host-local has no GC of its own: release the attachment's address as its DEL would
		if err := ipamDel(conf, args, p.Name, p.Labels[LabelIfName]); err != nil && first == nil {
			first = err
		}
		if l := p.Labels[LabelDevInfo]; l != "" && deviceInfoPathAllowed(conf, l) {
			if err := RemoveDeviceInfo(l); err != nil && first == nil {
				first = newErr(ErrDeviceInfo, "%v", err)
			}
		}
	}
	if err := invoke.DelegateGC(context.TODO(), conf.IPAM.Type, args.StdinData, nil); err != nil && first == nil {
		first = err
	}
	return first
}

// ipamDel runs the IPAM plugin's DEL for another attachment than the one in the environment
// (GC has none): containerID and ifName as the attachment's ADD had them.
func ipamDel(conf *NetConf, args *skel.CmdArgs, containerID, ifName string) error {
	paths := filepath.SplitList(args.Path)
	bin, err := invoke.FindInPath(conf.IPAM.Type, paths)
	if err != nil {
		return err
	}
	a := &invoke.Args{Command: "DEL", ContainerID: containerID, IfName: ifName, Path: args.Path}
	return invoke.ExecPluginWithoutResult(context.TODO(), bin, args.StdinData, a, nil)
}

// Status says whether the plugin can serve ADD: the daemon must answer (else 50, "not
// available"), and so must the IPAM plugin.
func Status(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := daemon.New(conf.DaemonSocket).Status(); err != nil {
		return types.NewError(ErrPluginNotAvailable, "docknet daemon not available", err.Error())
	}
	return invoke.DelegateStatus(context.TODO(), conf.IPAM.Type, args.StdinData, nil)
}

// timer: with DOCKNET_CNI_TIMING set, a verb prints how long its steps took (one line of JSON
// on stderr, which runtimes log), from the verb's start (the process's own start-up is not in
// it).
type timer struct {
	on    bool
	last  time.Time
	steps []string
}

func newTimer() *timer {
	return &timer{on: os.Getenv("DOCKNET_CNI_TIMING") != "", last: time.Now()}
}

func (t *timer) step(name string) {
	if !t.on {
		return
	}
	now := time.Now()
	t.steps = append(t.steps, fmt.Sprintf("%q: %.3f", name, float64(now.Sub(t.last).Microseconds())/1e3))
	t.last = now
}

func (t *timer) report(verb string) {
	if t.on {
		t.step("result")
		fmt.Fprintf(os.Stderr, "{\"verb\": %q, \"ms\": {%s}}\n", verb, strings.Join(t.steps, ", "))
	}
}
