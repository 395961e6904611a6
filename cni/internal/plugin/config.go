package plugin

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"docknet/cni/internal/daemon"
)

// Bounds on what the runtime hands the plugin (it is not trusted: a bug or a hostile
// orchestrator must not make a root process allocate without bound or panic).
const (
	// MaxConfig is the longest network configuration read from stdin.
	MaxConfig = 1 << 20
	// MaxContainerID is the longest container ID (a pipe is named after it).
	MaxContainerID = 128
	// maxArgs is the longest CNI_ARGS.
	maxArgs = 8 << 10
	// maxPeers is the most fast-channel peers one pod may ask for.
	maxPeers = 16
	// maxPrevEntries bounds the interfaces and addresses of a prevResult.
	maxPrevEntries = 64
	// maxUnixPath is sun_path's size, terminating NUL included.
	maxUnixPath = 108
	// maxLabelValue is the longest label value the daemon keeps.
	maxLabelValue = 1024
)

// Defaults.
const (
	DefaultSocketName    = "docknet/pipe"
	DefaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/cni"
	// ChainedInterface names the pipe in the result when another plugin made CNI_IFNAME.
	ChainedInterface = "docknet0"
	// FastChannelAnnotation is the pod annotation that asks for fast channels: a
	// comma-separated list of pods (NAME in the pod's namespace, or NAMESPACE/NAME).
	FastChannelAnnotation = "docknet.io/fast-channel-peers"
	// PodAnnotationsCapability is containerd's and CRI-O's capability carrying pod annotations.
	PodAnnotationsCapability = "io.kubernetes.cri.pod-annotations"
)

// Labels the plugin records with the pipes it creates (the daemon keeps them in its state).
const (
	LabelOwner   = "docknet.io/owner"
	OwnerValue   = "docknet-cni"
	LabelNetwork = "cni.dev/network"
	LabelIfName  = "cni.dev/ifname"
	LabelPod     = "k8s.io/pod"
	LabelPeers   = "docknet.io/fast-channel-peers"
	LabelDevInfo = "docknet.io/device-info"
)

// Bandwidth is the `bandwidth` capability (CNI conventions): rates in bits/s, bursts in bits.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// RuntimeConfig is what the runtime fills in for the capabilities the plugin declares.
type RuntimeConfig struct {
	Bandwidth      *Bandwidth        `json:"bandwidth,omitempty"`
	PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	DeviceInfoFile string            `json:"CNIDeviceInfoFile,omitempty"`
}

// NetConf is the plugin's configuration.
//
//	{"cniVersion": "1.1.0", "name": "docknet", "type": "docknet",
//	 "daemonSocket": "/run/docknet/docknetd.sock", "mtu": 1500,
//	 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}}
type NetConf struct {
	types.PluginConf
	// DaemonSocket is the daemon's control socket.
	DaemonSocket string `json:"daemonSocket,omitempty"`
	// MTU of the pipe (68-65535; 0: the daemon's default, 1500).
	MTU uint32 `json:"mtu,omitempty"`
	// SocketName is the abstract socket bound in the pod's network namespace, without '@'.
	SocketName string `json:"socketName,omitempty"`
	// DeviceInfoDir is where device-info files are written when the runtime names none.
	DeviceInfoDir string         `json:"deviceInfoDir,omitempty"`
	RuntimeConfig *RuntimeConfig `json:"runtimeConfig,omitempty"`

	// Prev is the previous plugin's result, converted to 1.x (nil: none, or empty).
	Prev *current.Result `json:"-"`
}

// charset reports whether s is minLen..maxLen bytes, each an ASCII letter or digit or one of
// extra, and (when alnumEnds) begins and ends with a letter or digit. (Hand-written rather
// than regexps: compiling them cost a millisecond of every plugin run.)
func charset(s string, minLen, maxLen int, extra string, alnumEnds bool) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		if !alnum(s[i]) && !strings.ContainsRune(extra, rune(s[i])) {
			return false
		}
	}
	return !alnumEnds || len(s) == 0 || alnum(s[0]) && alnum(s[len(s)-1])
}

// validSocketName: what the daemon accepts in an abstract socket name (registry.rs
// validate_socket).
func validSocketName(s string) bool { return charset(s, 1, 64, "/_.-", false) }

// validPluginName: a plain executable name in CNI_PATH.
func validPluginName(s string) bool {
	return charset(s, 1, 64, "_.-", false) && s[0] != '.' && s[0] != '-' && s[0] != '_'
}

// validK8sName: a Kubernetes name (DNS-1123 subdomain) or namespace.
func validK8sName(s string) bool {
	return charset(s, 1, 253, "-.", true) && strings.ToLower(s) == s
}

// ConfigError is an invalid configuration (CNI code 7).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return "invalid network configuration: " + e.Msg }

func configErr(format string, a ...any) error { return &ConfigError{Msg: fmt.Sprintf(format, a...)} }

// ParseConfig decodes and checks the configuration; every refusal is a *ConfigError.
func ParseConfig(stdin []byte) (*NetConf, error) {
	if len(stdin) > MaxConfig {
		return nil, configErr("longer than %d bytes", MaxConfig)
	}
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, configErr("%v", err)
	}
	if conf.Type != "docknet" {
		return nil, configErr("type is %q; this plugin is \"docknet\"", conf.Type)
	}
	if conf.DaemonSocket == "" {
		conf.DaemonSocket = daemon.DefaultSocket
	}
	if !filepath.IsAbs(conf.DaemonSocket) || len(conf.DaemonSocket) >= maxUnixPath {
		return nil, configErr("daemonSocket %q must be an absolute path shorter than %d bytes", conf.DaemonSocket, maxUnixPath)
	}
	if conf.MTU != 0 && (conf.MTU < 68 || conf.MTU > 65535) {
		return nil, configErr("mtu %d is out of range 68-65535", conf.MTU)
	}
	if conf.SocketName == "" {
		conf.SocketName = DefaultSocketName
	}
	if !validSocketName(conf.SocketName) {
		return nil, configErr("socketName %q: use 1-64 of A-Z a-z 0-9 / _ . -", conf.SocketName)
	}
	if conf.DeviceInfoDir == "" {
		conf.DeviceInfoDir = DefaultDeviceInfoDir
	}
	if !filepath.IsAbs(conf.DeviceInfoDir) || filepath.Clean(conf.DeviceInfoDir) != conf.DeviceInfoDir {
		return nil, configErr("deviceInfoDir %q must be a clean absolute path", conf.DeviceInfoDir)
	}
	if conf.IPAM.Type == "" {
		return nil, configErr("ipam.type is missing (DockNet delegates addresses, e.g. to host-local)")
	}
	if !validPluginName(conf.IPAM.Type) {
		return nil, configErr("ipam.type %q is not a plugin name", conf.IPAM.Type)
	}
	if rc := conf.RuntimeConfig; rc != nil {
		if bw := rc.Bandwidth; bw != nil {
			if (bw.IngressBurst != 0 && bw.IngressRate == 0) || (bw.EgressBurst != 0 && bw.EgressRate == 0) {
				return nil, configErr("runtimeConfig.bandwidth: a burst needs its rate")
			}
		}
		if len(rc.PodAnnotations) > 4096 {
			return nil, configErr("runtimeConfig: too many pod annotations")
		}
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, configErr("prevResult: %v", err)
		}
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return nil, configErr("prevResult: %v", err)
		}
		if len(prev.Interfaces) > maxPrevEntries || len(prev.IPs) > maxPrevEntries || len(prev.Routes) > 4*maxPrevEntries {
			return nil, configErr("prevResult has more than %d interfaces or addresses", maxPrevEntries)
		}
		for _, ip := range prev.IPs {
			if ip.Interface != nil && (*ip.Interface < 0 || *ip.Interface >= len(prev.Interfaces)) {
				return nil, configErr("prevResult: address %s names interface %d of %d", ip.Address.String(), *ip.Interface, len(prev.Interfaces))
			}
		}
		// an empty prevResult (a DEL after a lost result) is no previous plugin
		if len(prev.Interfaces) > 0 || len(prev.IPs) > 0 {
			conf.Prev = prev
		}
	}
	return conf, nil
}

// K8sArgs are the CNI_ARGS a Kubernetes runtime passes (the others are ignored).
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive,staticcheck // CNI_ARGS keys
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive,staticcheck
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive,staticcheck
	K8S_POD_UID                types.UnmarshallableString //nolint:revive,staticcheck
}

// Pod identifies a Kubernetes pod.
type Pod struct{ Namespace, Name string }

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// EnvError is a bad environment (CNI code 4).
type EnvError struct{ Msg string }

func (e *EnvError) Error() string { return e.Msg }

// ParseArgs reads the pod from CNI_ARGS (nil when the runtime names none).
func ParseArgs(args string) (*Pod, error) {
	if len(args) > maxArgs {
		return nil, &EnvError{Msg: fmt.Sprintf("CNI_ARGS longer than %d bytes", maxArgs)}
	}
	a := K8sArgs{CommonArgs: types.CommonArgs{IgnoreUnknown: true}}
	if err := types.LoadArgs(args, &a); err != nil {
		return nil, &EnvError{Msg: fmt.Sprintf("CNI_ARGS: %v", err)}
	}
	name, ns := string(a.K8S_POD_NAME), string(a.K8S_POD_NAMESPACE)
	if name == "" && ns == "" {
		return nil, nil
	}
	if !validK8sName(name) || !validK8sName(ns) {
		return nil, &EnvError{Msg: fmt.Sprintf("CNI_ARGS: pod %q in namespace %q is not a valid Kubernetes name", name, ns)}
	}
	return &Pod{Namespace: ns, Name: name}, nil
}

// FastChannelPeers is what the pod's annotation asks for, as NAMESPACE/NAME, sorted and
// without duplicates. Without a pod (no Kubernetes names in CNI_ARGS) nobody can be named.
func FastChannelPeers(conf *NetConf, pod *Pod) ([]string, error) {
	if conf.RuntimeConfig == nil {
		return nil, nil
	}
	raw, ok := conf.RuntimeConfig.PodAnnotations[FastChannelAnnotation]
	if !ok || strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	if pod == nil {
		return nil, configErr("annotation %s needs the pod's name in CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME)", FastChannelAnnotation)
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(raw, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		ns, name, found := strings.Cut(item, "/")
		if !found {
			ns, name = pod.Namespace, item
		}
		if !validK8sName(ns) || !validK8sName(name) {
			return nil, configErr("annotation %s: %q is not a pod (NAME or NAMESPACE/NAME)", FastChannelAnnotation, item)
		}
		peer := Pod{Namespace: ns, Name: name}.String()
		if peer != pod.String() {
			seen[peer] = true
		}
	}
	if len(seen) > maxPeers {
		return nil, configErr("annotation %s names %d pods, at most %d", FastChannelAnnotation, len(seen), maxPeers)
	}
	peers := make([]string, 0, len(seen))
	for p := range seen {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	if n := len(strings.Join(peers, ",")); n > maxLabelValue {
		return nil, configErr("annotation %s: the pods named take %d bytes, at most %d", FastChannelAnnotation, n, maxLabelValue)
	}
	return peers, nil
}
