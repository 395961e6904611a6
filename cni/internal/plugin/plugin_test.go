package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"docknet/cni/internal/daemon"
)

const base = `{"cniVersion":"1.1.0","name":"dn","type":"docknet","ipam":{"type":"host-local"}`

func conf(t *testing.T, extra string) (*NetConf, error) {
	t.Helper()
	return ParseConfig([]byte(base + extra + "}"))
}

func TestConfigDefaultsAndRefusals(t *testing.T) {
	c, err := conf(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.DaemonSocket != daemon.DefaultSocket || c.SocketName != DefaultSocketName || c.DeviceInfoDir != DefaultDeviceInfoDir || c.Prev != nil {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range []string{
		`,"type":"bridge"`, `,"mtu":67`, `,"mtu":65536`, `,"daemonSocket":"rel"`, `,"socketName":"a b"`,
		`,"deviceInfoDir":"/a/./b"`, `,"ipam":{"type":"../x"}`, `,"ipam":{"type":""}`, `,"mtu":"x"`,
		`,"runtimeConfig":{"bandwidth":{"egressBurst":5}}`,
		`,"prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24","interface":3}]}`,
	} {
		var ce *ConfigError
		if _, err := conf(t, bad); !errors.As(err, &ce) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := ParseConfig([]byte(strings.Repeat(" ", MaxConfig+1))); err == nil {
		t.Error("an oversized configuration was accepted")
	}
	// an empty prevResult is no previous plugin (a DEL after a lost result)
	c, err = conf(t, `,"prevResult":{"cniVersion":"1.1.0"}`)
	if err != nil || c.Prev != nil {
		t.Fatalf("empty prevResult: %v %+v", err, c.Prev)
	}
}

func TestPodsAndFastChannelPeers(t *testing.T) {
	pod, err := ParseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;OTHER=x")
	if err != nil || pod == nil || pod.String() != "shop/web" {
		t.Fatalf("%v %v", pod, err)
	}
	for _, bad := range []string{"K8S_POD_NAME=Web;K8S_POD_NAMESPACE=x", "nonsense", strings.Repeat("a", maxArgs+1)} {
		var ee *EnvError
		if _, err := ParseArgs(bad); !errors.As(err, &ee) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	c, _ := conf(t, `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"docknet.io/fast-channel-peers":" db, other/cache ,db,web,"}}`)
	peers, err := FastChannelPeers(c, pod)
	if err != nil || strings.Join(peers, " ") != "other/cache shop/db" {
		t.Fatalf("%v %v", peers, err)
	}
	if _, err := FastChannelPeers(c, nil); err == nil {
		t.Error("peers without a pod name were accepted")
	}
	c, _ = conf(t, `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"docknet.io/fast-channel-peers":"a/b/c"}}`)
	if _, err := FastChannelPeers(c, pod); err == nil {
		t.Error("a bad peer name was accepted")
	}
}

func TestDeviceInfoPathsAndFiles(t *testing.T) {
	dir := t.TempDir()
	c, _ := conf(t, `,"deviceInfoDir":"`+dir+`"`)
	p, err := DeviceInfoPath(c, "abc", "eth0")
	if err != nil || p != filepath.Join(dir, "dn-abc-eth0-device.json") {
		t.Fatalf("%s %v", p, err)
	}
	for _, bad := range []string{"/etc/passwd", dir + "/../x", dir + "/.hidden", dir + "/sub/x"} {
		c.RuntimeConfig = &RuntimeConfig{DeviceInfoFile: bad}
		if _, err := DeviceInfoPath(c, "abc", "eth0"); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	c.RuntimeConfig = &RuntimeConfig{DeviceInfoFile: filepath.Join(dir, "multus-name")}
	if p, err = DeviceInfoPath(c, "abc", "eth0"); err != nil {
		t.Fatal(err)
	}
	rec := &DeviceInfo{Type: "memif", Version: DeviceInfoVersion, Memif: &MemifInfo{Role: "slave", Path: "@docknet/pipe", Mode: "ethernet"}}
	if err := WriteDeviceInfo(p, rec); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if string(b) != `{"type":"memif","version":"1.1.0","memif":{"role":"slave","path":"@docknet/pipe","mode":"ethernet"}}` {
		t.Fatalf("%s", b)
	}
	// a link planted at the name is replaced, never followed
	target := filepath.Join(dir, "target")
	_ = os.WriteFile(target, []byte("keep"), 0o600)
	_ = os.Remove(p)
	_ = os.Symlink(target, p)
	if err := WriteDeviceInfo(p, rec); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("the link was followed")
	}
	if err := RemoveDeviceInfo(p); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDeviceInfo(p); err != nil {
		t.Fatal("removing twice:", err)
	}
}

func TestErrorsGetTheirCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		code uint
	}{
		{&ConfigError{Msg: "x"}, types.ErrInvalidNetworkConfig},
		{&EnvError{Msg: "x"}, types.ErrInvalidEnvironmentVariables},
		{&daemon.UnavailableError{Socket: "s", Err: errors.New("x")}, types.ErrTryAgainLater},
		{&daemon.APIError{Code: daemon.CodeBusy}, types.ErrTryAgainLater},
		{&daemon.APIError{Code: daemon.CodeIPInUse}, ErrAddressInUse},
		{&daemon.APIError{Code: daemon.CodeExists}, ErrPipeExists},
		{&daemon.APIError{Code: daemon.CodeBadParams}, types.ErrInvalidNetworkConfig},
		{&daemon.APIError{Code: daemon.CodeInternal}, ErrDaemon},
		{newErr(ErrMismatch, "x"), ErrMismatch},
		{types.NewError(42, "ipam", ""), 42},
		{errors.New("other"), ErrDaemon},
	} {
		if got := ToCNI(c.err).Code; got != c.code {
			t.Errorf("%T %v: code %d, want %d", c.err, c.err, got, c.code)
		}
	}
}
