package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallsBinariesAndALoadableConflist(t *testing.T) {
	from, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	for _, b := range []string{"docknet-cni", "host-local"} {
		_ = os.WriteFile(filepath.Join(from, b), []byte("#!"+b), 0o755)
	}
	o := &Options{From: from, BinDir: bin, ConfDir: conf, ConfName: "10-docknet.conflist", Network: "docknet",
		Plugins: []string{"docknet-cni", "host-local"}, Subnet: "10.250.0.0/16", DaemonSocket: "/run/docknet/docknetd.sock",
		MTU: 1500, CNIVersion: "1.0.0"}
	if _, err := Run(o); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(bin, "docknet")); string(b) != "#!docknet-cni" {
		t.Fatalf("plugin installed as %q", b)
	}
	var got map[string]any
	b, _ := os.ReadFile(filepath.Join(conf, "10-docknet.conflist"))
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	p := got["plugins"].([]any)[0].(map[string]any)
	if p["type"] != "docknet" || got["cniVersion"] != "1.0.0" || p["capabilities"].(map[string]any)["bandwidth"] != true {
		t.Fatalf("%s", b)
	}
	// chaining onto an existing conflist, twice: DockNet is appended once
	_ = os.WriteFile(filepath.Join(conf, "05-cluster.conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"cluster","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`), 0o644)
	o.ChainOnto = "05-cluster.conflist"
	for i := 0; i < 2; i++ {
		if _, err := Run(o); err != nil {
			t.Fatal(err)
		}
	}
	b, _ = os.ReadFile(filepath.Join(conf, "05-cluster.conflist"))
	if strings.Count(string(b), `"docknet"`) != 1 || !strings.Contains(string(b), `"bridge"`) {
		t.Fatalf("%s", b)
	}
	for _, bad := range []*Options{{Subnet: "nonsense"}, {Subnet: "10.0.0.0/8", Plugins: []string{"../x"}}} {
		if _, err := Run(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestANodesPodNetworkBoundsTheAddressesAndNoConfWritesNone(t *testing.T) {
	from, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	_ = os.WriteFile(filepath.Join(from, "docknet-cni"), []byte("#!x"), 0o755)
	o := &Options{From: from, BinDir: bin, ConfDir: conf, ConfName: "10-docknet.conflist", Network: "docknet",
		Plugins: []string{"docknet-cni"}, Subnet: "10.244.0.0/16", PodCIDR: "10.244.3.0/24",
		DaemonSocket: "/run/docknet/docknetd.sock", MTU: 1500, CNIVersion: "1.0.0", NoConf: true}
	written, err := Run(o)
	if err != nil || len(written) != 1 {
		t.Fatalf("%v %v", written, err)
	}
	if _, err := os.Stat(filepath.Join(conf, "10-docknet.conflist")); !os.IsNotExist(err) {
		t.Fatalf("--no-conf wrote a conflist: %v", err)
	}
	path, err := WriteConf(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	r := got["plugins"].([]any)[0].(map[string]any)["ipam"].(map[string]any)["ranges"].([]any)[0].([]any)[0].(map[string]any)
	if r["subnet"] != "10.244.0.0/16" || r["rangeStart"] != "10.244.3.1" || r["rangeEnd"] != "10.244.3.254" {
		t.Fatalf("range %v", r)
	}
	for _, bad := range []string{"10.245.0.0/24", "10.244.3.1/24", "10.0.0.0/8", "10.244.3.0/31", "fd00::/64", "x"} {
		o.PodCIDR = bad
		if _, err := WriteConf(o); err == nil {
			t.Errorf("pod network %s accepted", bad)
		}
	}
}
