// Package install is what the DaemonSet's init container runs (`docknet-cni-install`), like
// Calico's install-cni: it copies the plugin binaries into the node's CNI bin directory and
// writes the network configuration into its CNI conf directory, each file atomically (a
// temporary file renamed over the name), so a runtime never reads half a file.
package install

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// Options of `docknet-cni-install`.
type Options struct {
	From         string
	BinDir       string
	ConfDir      string
	ConfName     string
	Network      string
	Plugins      []string
	Subnet       string
	PodCIDR      string
	NoConf       bool
	DaemonSocket string
	MTU          uint
	CNIVersion   string
	ChainOnto    string
	IPAMDataDir  string
	DevInfoDir   string
}

const usage = `usage: docknet-cni-install [options]

Copies the plugin binaries into the node's CNI bin directory and writes DockNet's network
configuration into its CNI conf directory (each file atomically).

  standalone (default): writes CONF-DIR/CONF-NAME, a conflist with DockNet alone:
                        the pipe is the pod's network
  --chain-onto FILE:    appends DockNet to an existing conflist in CONF-DIR (the cluster's
                        network stays the pod's eth0; the pipe is a second network)

Options:
`

// Main runs the installer with command-line arguments; its exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("docknet-cni-install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	exe, _ := os.Executable()
	o := Options{}
	fs.StringVar(&o.From, "from", filepath.Dir(exe), "directory holding the binaries to install")
	fs.StringVar(&o.BinDir, "bin-dir", "/host/opt/cni/bin", "the node's CNI bin directory, as mounted")
	fs.StringVar(&o.ConfDir, "conf-dir", "/host/etc/cni/net.d", "the node's CNI conf directory, as mounted")
	fs.StringVar(&o.ConfName, "conf-name", "10-docknet.conflist", "file name of the standalone conflist")
	fs.StringVar(&o.Network, "network", "docknet", "network name")
	plugins := fs.String("plugins", "docknet-cni,host-local", "comma-separated binaries to copy (docknet-cni is installed as \"docknet\")")
	fs.StringVar(&o.Subnet, "subnet", "10.250.0.0/16", "host-local range the pipes' addresses come from (with nodes routed to each other: the cluster's pod network, each pipe's prefix)")
	fs.StringVar(&o.PodCIDR, "pod-cidr", "", "this node's pod network inside --subnet: addresses are handed out from it alone (docknet-agent --cni-conf writes this from the node's spec.podCIDRs)")
	fs.BoolVar(&o.NoConf, "no-conf", false, "copy the binaries only; write no conflist (docknet-agent --cni-conf writes it once it knows the node's pod network)")
	fs.StringVar(&o.DaemonSocket, "daemon-socket", "/run/docknet/docknetd.sock", "the daemon's control socket on the node")
	fs.UintVar(&o.MTU, "mtu", 1500, "pipe MTU")
	fs.StringVar(&o.CNIVersion, "cni-version", "1.0.0", "cniVersion of the conflist (1.1.0 for runtimes that call GC and STATUS; containerd 1.6 and 1.7 speak up to 1.0.0)")
	fs.StringVar(&o.IPAMDataDir, "ipam-data-dir", "", "host-local's lease directory (default its own, /var/lib/cni/networks)")
	fs.StringVar(&o.DevInfoDir, "device-info-dir", "", "where device-info files go when the runtime names none (default /var/run/k8s.cni.cncf.io/devinfo/cni)")
	fs.StringVar(&o.ChainOnto, "chain-onto", "", "append DockNet to this conflist in CONF-DIR instead of writing a standalone one")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	o.Plugins = strings.Split(*plugins, ",")
	written, err := Run(&o)
	if err != nil {
		fmt.Fprintf(stderr, "docknet-cni-install: %v\n", err)
		return 1
	}
	for _, w := range written {
		fmt.Fprintf(stdout, "installed %s\n", w)
	}
	return 0
}

// podRange is host-local's range for pod network pod inside subnet: its addresses but the
// first and the last.
func podRange(subnet, pod string) (map[string]string, error) {
	s, err := netip.ParsePrefix(subnet)
	if err != nil {
		return nil, fmt.Errorf("--subnet: %w", err)
	}
	r := map[string]string{"subnet": s.String()}
	if pod == "" {
		return r, nil
	}
	p, err := netip.ParsePrefix(pod)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr: %w", err)
	}
	if !p.Addr().Is4() || p.Masked() != p || p.Bits() > 30 || p.Bits() < s.Bits() || !s.Contains(p.Addr()) {
		return nil, fmt.Errorf("--pod-cidr %s: want an IPv4 network of at least 4 addresses, no host bits set, inside --subnet %s", p, s)
	}
	first := p.Addr().Next()
	last := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(last[0])<<24 | uint32(last[1])<<16 | uint32(last[2])<<8 | uint32(last[3])) + host - 1
	r["rangeStart"] = first.String()
	r["rangeEnd"] = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	return r, nil
}

// PluginEntry is DockNet's entry in a conflist.
func PluginEntry(o *Options) (map[string]any, error) {
	rng, err := podRange(o.Subnet, o.PodCIDR)
	if err != nil {
		return nil, err
	}
	ipam := map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{rng}},
	}
	if o.IPAMDataDir != "" {
		ipam["dataDir"] = o.IPAMDataDir
	}
	e := map[string]any{
		"type":         "docknet",
		"daemonSocket": o.DaemonSocket,
		"mtu":          o.MTU,
		"capabilities": map[string]bool{
			"bandwidth":                         true,
			"io.kubernetes.cri.pod-annotations": true,
			"CNIDeviceInfoFile":                 true,
		},
		"ipam": ipam,
	}
	if o.DevInfoDir != "" {
		e["deviceInfoDir"] = o.DevInfoDir
	}
	return e, nil
}

// Run installs; the paths it wrote.
func Run(o *Options) ([]string, error) {
	if _, _, err := net.ParseCIDR(o.Subnet); err != nil {
		return nil, fmt.Errorf("--subnet: %w", err)
	}
	if _, err := podRange(o.Subnet, o.PodCIDR); err != nil {
		return nil, err
	}
	var written []string
	for _, p := range o.Plugins {
		p = strings.TrimSpace(p)
		if p == "" || strings.ContainsAny(p, "/\\") {
			return nil, fmt.Errorf("--plugins: %q is not a binary name", p)
		}
		dst := p
		if p == "docknet-cni" {
			dst = "docknet" // the runtime runs the plugin named by "type"
		}
		src, err := os.ReadFile(filepath.Join(o.From, p))
		if err != nil {
			return nil, err
		}
		path := filepath.Join(o.BinDir, dst)
		if err := writeAtomic(path, src, 0o755); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	if o.NoConf {
		return written, nil
	}
	path, err := WriteConf(o)
	if err != nil {
		return nil, err
	}
	return append(written, path), nil
}

// WriteConf writes the conflist alone (standalone, or DockNet chained onto --chain-onto),
// atomically; its path.
func WriteConf(o *Options) (string, error) {
	entry, err := PluginEntry(o)
	if err != nil {
		return "", err
	}
	var conf []byte
	var path string
	if o.ChainOnto != "" {
		if filepath.Base(o.ChainOnto) != o.ChainOnto {
			return "", fmt.Errorf("--chain-onto: %q must be a file name in %s", o.ChainOnto, o.ConfDir)
		}
		path = filepath.Join(o.ConfDir, o.ChainOnto)
		old, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		conf, err = chain(old, entry)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
	} else {
		if filepath.Base(o.ConfName) != o.ConfName || o.ConfName == "" {
			return "", fmt.Errorf("--conf-name: %q must be a file name", o.ConfName)
		}
		path = filepath.Join(o.ConfDir, o.ConfName)
		var err error
		conf, err = json.MarshalIndent(map[string]any{
			"cniVersion": o.CNIVersion,
			"name":       o.Network,
			"plugins":    []any{entry},
		}, "", "  ")
		if err != nil {
			return "", err
		}
	}
	if _, err := libcni.ConfListFromBytes(conf); err != nil {
		return "", fmt.Errorf("the configuration written would not load: %w", err)
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(conf)+"\n" {
		return path, nil // unchanged: not rewritten
	}
	if err := writeAtomic(path, append(conf, '\n'), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// chain appends DockNet to a conflist's plugins, replacing an entry of type docknet already
// there (installing twice changes nothing).
func chain(old []byte, entry map[string]any) ([]byte, error) {
	var list map[string]any
	if err := json.Unmarshal(old, &list); err != nil {
		return nil, err
	}
	plugins, ok := list["plugins"].([]any)
	if !ok {
		return nil, errors.New("not a conflist (no \"plugins\" list)")
	}
	kept := plugins[:0]
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "docknet" {
			continue
		}
		kept = append(kept, p)
	}
	list["plugins"] = append(kept, entry)
	return json.MarshalIndent(list, "", "  ")
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, werr)
	}
	return nil
}
