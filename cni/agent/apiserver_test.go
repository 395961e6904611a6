package agent

// The agent against a real kube-apiserver (built by scripts/k8s-api.sh into bin/, storage in
// kine over SQLite): Node objects created, changed and deleted through the API reach the
// daemon within a second, and a restarted agent finds nothing to change.

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// apiBins returns the directory holding kube-apiserver and kine, or skips the test (fails it
// where DOCKNET_REQUIRE_K8S_API=1, as scripts/test.sh sets).
func apiBins(t *testing.T) string {
	dir := os.Getenv("DOCKNET_K8S_API_BIN")
	if dir == "" {
		dir = "../../bin"
	}
	for _, b := range []string{"kube-apiserver", "kine"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			if os.Getenv("DOCKNET_REQUIRE_K8S_API") == "1" {
				t.Fatalf("%s missing in %s (scripts/k8s-api.sh builds it)", b, dir)
			}
			t.Skipf("%s missing in %s (scripts/k8s-api.sh builds it)", b, dir)
		}
	}
	abs, _ := filepath.Abs(dir)
	return abs
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs a process for the test's lifetime, ended by its pid at cleanup; its output goes
// to log.
func start(t *testing.T, log string, name string, args ...string) {
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(name, args...)
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
		f.Close()
	})
}

// realAPI starts kine and kube-apiserver on loopback and returns an administrator's client of
// it, and its configuration.
func realAPI(t *testing.T) (kubernetes.Interface, *rest.Config) {
	bins := apiBins(t)
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "sa.key"), keyPEM, 0o600))
	token := "docknet-agent-test"
	must(os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600))
	kine, api := freePort(t), freePort(t)
	start(t, filepath.Join(dir, "kine.log"), filepath.Join(bins, "kine"),
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", kine),
		"--endpoint", "sqlite://"+filepath.Join(dir, "db.sqlite")+"?_journal=WAL&cache=shared")
	start(t, filepath.Join(dir, "apiserver.log"), filepath.Join(bins, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", kine),
		"--storage-media-type=application/json",
		fmt.Sprintf("--secure-port=%d", api), "--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16")
	url := fmt.Sprintf("https://127.0.0.1:%d", api)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the server's own self-signed certificate
	}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest("GET", url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "apiserver.log"))
			t.Fatalf("kube-apiserver not ready within 90 s: %v\n%s", err, log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	must(os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, url, token)), 0o600))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	must(err)
	client, err := kubernetes.NewForConfig(cfg)
	must(err)
	return client, cfg
}

// agentClient creates what deploy/daemonset.yaml gives the agent (its namespace, service
// account, ClusterRole and binding) and returns a client with a token of that account.
func agentClient(ctx context.Context, t *testing.T, admin kubernetes.Interface, adminConfig *rest.Config) kubernetes.Interface {
	t.Helper()
	manifest, err := os.ReadFile("../../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sa corev1.ServiceAccount
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for _, doc := range strings.Split(string(manifest), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var into any
		switch meta.Kind {
		case "ServiceAccount":
			into = &sa
		case "ClusterRole":
			into = &role
		case "ClusterRoleBinding":
			into = &binding
		default:
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	if sa.Name == "" || role.Name == "" || binding.Name == "" {
		t.Fatal("deploy/daemonset.yaml lacks the agent's service account, ClusterRole or binding")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sa.Namespace}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(adminConfig)
	cfg.BearerToken = tok.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// what the role does not grant stays refused (RBAC is on)
	if _, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the agent's account may list pods: RBAC is not in force")
	}
	return c
}

func TestTheAgentFollowsNodesThroughARealAPIServer(t *testing.T) {
	client, adminConfig := realAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := client.CoreV1().Nodes()
	for _, n := range []*corev1.Node{
		node("self", "192.168.1.10", "10.244.0.0/24"),
		node("n1", "192.168.1.11", "10.244.1.0/24"),
	} {
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// the agent reads with the DaemonSet's own service account and ClusterRole
	agent := agentClient(ctx, t, client, adminConfig)
	src, err := NewKubeSource(ctx, agent, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := newFake(nil)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Self: "self", Cluster: cluster, Resync: time.Hour}, src, d) }()
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.11"}, "start")

	if _, err := nodes.Create(ctx, node("n2", "192.168.1.12", "10.244.2.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.11", "10.244.2.0/24": "192.168.1.12"}, "added")

	// a node's address changes through its status, as a kubelet reports it
	n1, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.111"}}
	if _, err := nodes.UpdateStatus(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.111", "10.244.2.0/24": "192.168.1.12"}, "changed")

	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, map[string]string{"10.244.1.0/24": "192.168.1.111"}, "removed")
	cancel()
	<-done

	// a restarted agent, with a new informer, changes nothing
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	src2, err := NewKubeSource(ctx2, agent, 0)
	if err != nil {
		t.Fatal(err)
	}
	pass, err := Sync(Config{Self: "self", Cluster: cluster}, src2, d)
	if err != nil || len(pass.Changes) != 0 {
		t.Fatalf("restart: %v %v", pass.Changes, err)
	}
}

func TestTheAgentFollowsServicesThroughARealAPIServer(t *testing.T) {
	client, adminConfig := realAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// the API server allocates the ClusterIP, as for every Service
	created, err := client.CoreV1().Services("default").Create(ctx,
		svc("web", "", corev1.ServiceAffinityNone, port("http", 80, corev1.ProtocolTCP)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := created.Spec.ClusterIP
	if !strings.HasPrefix(vip, "10.96.") {
		t.Fatalf("cluster IP %q", vip)
	}
	// no controller manager runs here: the slice an EndpointSlice controller would write
	no := false
	slices := client.DiscoveryV1().EndpointSlices("default")
	if _, err := slices.Create(ctx, slice("web-1", "web", map[string]int32{"http": 8080},
		ep{"10.244.1.2", nil}, ep{"10.244.1.3", &no}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agent := agentClient(ctx, t, client, adminConfig)
	// this node, in zone a (its zone decides, for Services that prefer close endpoints)
	self := node("svc-node", "192.168.1.21", "10.244.1.0/24")
	self.Labels = map[string]string{corev1.LabelTopologyZone: "zone-a"}
	if _, err := client.CoreV1().Nodes().Create(ctx, self, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src, err := NewKubeServices(ctx, agent, 0, "svc-node")
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeServices{all: map[string]Service{}}
	done := make(chan error, 1)
	go func() { done <- RunServices(ctx, Config{Resync: time.Hour}, src, d) }()
	// the API server's own Service is there too, without endpoints (no reconciler runs)
	api := "tcp 10.96.0.1:443 none -> "
	waitServices(t, d, map[string]string{
		"k8s.default.kubernetes.https": api,
		"k8s.default.web.http":         "tcp " + vip + ":80 none -> 10.244.1.2:8080",
	}, "start")
	if _, err := slices.Update(ctx, slice("web-1", "web", map[string]int32{"http": 8080},
		ep{"10.244.1.2", nil}, ep{"10.244.1.3", nil}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{
		"k8s.default.kubernetes.https": api,
		"k8s.default.web.http":         "tcp " + vip + ":80 none -> 10.244.1.2:8080,10.244.1.3:8080",
	}, "endpoint ready")

	// the Service prefers endpoints in its callers' zone, and the slice says which zone each
	// endpoint serves (the EndpointSlice controller's hints): this node gets zone a's
	web, err := client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	preferClose := corev1.ServiceTrafficDistributionPreferClose
	web.Spec.TrafficDistribution = &preferClose
	if _, err := client.CoreV1().Services("default").Update(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	zoned := slice("web-1", "web", map[string]int32{"http": 8080}, ep{"10.244.1.2", nil}, ep{"10.244.1.3", nil})
	zoned.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	zoned.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	if _, err := slices.Update(ctx, zoned, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{
		"k8s.default.kubernetes.https": api,
		"k8s.default.web.http":         "tcp " + vip + ":80 none -> 10.244.1.2:8080",
	}, "zone a's endpoint")
	// the node moves to zone b: its pods are given zone b's endpoint
	self, err = client.CoreV1().Nodes().Get(ctx, "svc-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	self.Labels[corev1.LabelTopologyZone] = "zone-b"
	if _, err := client.CoreV1().Nodes().Update(ctx, self, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{
		"k8s.default.kubernetes.https": api,
		"k8s.default.web.http":         "tcp " + vip + ":80 none -> 10.244.1.3:8080",
	}, "zone b's endpoint")
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServices(t, d, map[string]string{"k8s.default.kubernetes.https": api}, "removed")
	cancel()
	<-done
}
