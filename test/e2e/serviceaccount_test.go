package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// The real kube-apiserver and etcd, started once for the package by the
// first test that needs them.
var (
	testKube *kuberig.Kube
	kubeOnce sync.Once
	kubeErr  error
)

const (
	// nodeName is the node the e2e tests' pods are bound to, with no
	// kubelet: the node tests' kubelet is kuberig.NodeName, another node.
	nodeName = "rig-node"
	// proxyUser is the proxy's identity: the node's, as shipped, so that
	// the Node authorizer and NodeRestriction scope it to nodeName's pods.
	proxyUser = "system:node:" + nodeName
	audience  = "registry.rig.test"
	// metricsReader may get nodes/metrics, as Prometheus in a cluster.
	metricsReader = "metrics-reader"
)

func needKube(t *testing.T) *kuberig.Kube {
	t.Helper()
	needRig(t)
	kubeOnce.Do(func() {
		testKube, kubeErr = kuberig.Start(testRig, kuberig.Options{Audit: true, Users: []kuberig.User{
			{Name: proxyUser, Groups: []string{"system:nodes"}}, {Name: metricsReader}, {Name: "nobody"}}})
		if kubeErr != nil {
			return
		}
		// The nodes may request the token plugins' audiences (these tests'
		// and the node tests'), as deploy/kubernetes/token-audiences.yaml
		// grants them.
		var manifest []byte
		if manifest, kubeErr = os.ReadFile("../../deploy/kubernetes/token-audiences.yaml"); kubeErr == nil {
			kubeErr = testKube.CreateRBAC([]byte(strings.ReplaceAll(string(manifest), `["registry.example.com"]`, `["`+audience+`", "`+nodeAudience+`"]`)))
		}
		if kubeErr == nil {
			kubeErr = watchAsNode(testKube)
		}
	})
	if kubeErr != nil {
		t.Fatalf("starting kube-apiserver: %v", kubeErr)
	}
	return testKube
}

// asNode is a client with the proxy's identity: createPod waits until the
// Node authorizer relates a new pod to the node, as a kubelet only acts on
// a pod once it has seen it.
var asNode kubernetes.Interface

func watchAsNode(k *kuberig.Kube) error {
	path, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return err
	}
	asNode, err = kubernetes.NewForConfig(rc)
	return err
}

// apiTenant is a pod in the API, bound to the rig's node, and its crictl
// sandbox config with the same name, namespace and UID.
type apiTenant struct {
	tenant
	pod *corev1.Pod
}

func createPod(t *testing.T, k *kuberig.Kube, ns, name, sa string, policy corev1.PullPolicy, image string, secrets ...string) apiTenant {
	t.Helper()
	no := false
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: sa, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: policy}}}}
	for _, s := range secrets {
		p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	p, err := k.Admin.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() error {
		_, err := asNode.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err
	})
	cfg := writeJSON(t, ns+"-"+name+"-pod.json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": ns, "uid": string(p.UID), "attempt": 1},
		"log_directory": filepath.Join(testRig.Dir, "pod-logs"),
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	})
	return apiTenant{tenant: tenant{name: ns + "/" + name, uid: string(p.UID), config: cfg}, pod: p}
}

func createServiceAccount(t *testing.T, k *kuberig.Kube, ns, name, user string) *corev1.ServiceAccount {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if user != "" {
		sa.Annotations = map[string]string{"registry.test/user": user}
	}
	sa, err := k.Admin.CoreV1().ServiceAccounts(ns).Create(context.Background(), sa, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sa
}

func createNamespace(t *testing.T, k *kuberig.Kube, ns string) {
	t.Helper()
	if _, err := k.Admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tokenPluginSetup writes the token plugin's provider config: the
// kubelet's KEP-4412 attributes, with a required annotation; extraArgs go
// to the plugin.
func tokenPluginSetup(t *testing.T, extraArgs ...string) pluginSetup {
	t.Helper()
	s := newPluginDir(t, "tokenplugin")
	dir := s.dir
	creds := s.writeTokenUsers(t)
	s.wrap(t, "token-provider", tokenBin)
	args, _ := json.Marshal(append([]string{"--for-tests-only", "--audience", audience, "--credentials", creds, "--log", filepath.Join(dir, "claims.log")}, extraArgs...))
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: token-provider
    matchImages: ["%s"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: %s
    tokenAttributes:
      serviceAccountTokenAudience: %s
      cacheType: ServiceAccount
      requireServiceAccount: true
      requiredServiceAccountAnnotationKeys: ["registry.test/user"]
`, testRig.Registry, args, audience)
	os.WriteFile(s.config, []byte(cfg), 0o644)
	return s
}

// claims returns what the token plugin logged of the tokens it checked.
func (s pluginSetup) claims(t *testing.T) []map[string]any {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(s.dir, "claims.log"))
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestServiceAccountTokens(t *testing.T) {
	k := needKube(t)
	ctx := context.Background()
	img := testRig.Registry + "/" + rig.TeamAImage
	crictl(t, direct(), "rmi", img)
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })

	for _, ns := range []string{"sa-a", "sa-b"} {
		createNamespace(t, k, ns)
	}
	createServiceAccount(t, k, "sa-a", "builder", "alice")
	createServiceAccount(t, k, "sa-b", "builder", "bob")
	createServiceAccount(t, k, "sa-a", "plain", "")
	a1 := createPod(t, k, "sa-a", "a1", "builder", corev1.PullIfNotPresent, img)
	a2 := createPod(t, k, "sa-a", "a2", "builder", corev1.PullIfNotPresent, img)
	b1 := createPod(t, k, "sa-b", "b1", "builder", corev1.PullIfNotPresent, img)
	n1 := createPod(t, k, "sa-a", "n1", "plain", corev1.PullIfNotPresent, img)

	plugin := tokenPluginSetup(t)
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	p := startEnsureProxy(t, "sa", "--kubeconfig", kubeconfig, "--node-name", nodeName,
		"--image-credential-provider-config", plugin.config, "--image-credential-provider-bin-dir", plugin.binDir)

	t.Run("a pod pulls with its service account's token, checked by the plugin", func(t *testing.T) {
		if r := a1.pull(t, p.ep, img); r.Err != nil {
			t.Fatalf("%v\n%s\nproxy log:\n%s", r.Err, r.Stderr, tail(p.proc.LogText(), 20))
		}
		c := plugin.claims(t)
		if len(c) != 1 || c[0]["podUID"] != a1.uid || c[0]["pod"] != "a1" || c[0]["serviceAccount"] != "builder" ||
			c[0]["namespace"] != "sa-a" || fmt.Sprint(c[0]["audience"]) != "["+audience+"]" || c[0]["expiresInSeconds"].(float64) <= 0 {
			t.Errorf("the plugin saw %v", c)
		}
	})

	t.Run("a pod of the same service account re-uses the image with zero registry requests", func(t *testing.T) {
		if n := a2.pullCountingRequests(t, p.ep, img); n != 0 {
			t.Errorf("%d registry requests, want 0", n)
		}
		if n := plugin.runs("token-provider"); n != 1 {
			t.Errorf("the plugin ran %d times, want 1", n)
		}
	})

	t.Run("a pod of another service account verifies at the registry with its own token", func(t *testing.T) {
		if b1.pullCountingRequests(t, p.ep, img) == 0 {
			t.Errorf("no registry request: B re-used A's verification")
		}
	})

	t.Run("a service account without the required annotation gets no token credential", func(t *testing.T) {
		r := n1.pull(t, p.ep, img)
		if r.Err == nil || !strings.Contains(r.Stderr, "lacks the required annotation registry.test/user") || !strings.Contains(crictlMessage(r.Stderr), registryRefusal(t, img, nil)) {
			t.Errorf("%v\n%s", r.Err, fatalMessage(r.Stderr))
		}
	})

	t.Run("a re-created service account (new UID) must verify again", func(t *testing.T) {
		if err := k.Admin.CoreV1().ServiceAccounts("sa-a").Delete(ctx, "builder", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		createServiceAccount(t, k, "sa-a", "builder", "alice")
		if a2.pullCountingRequests(t, p.ep, img) == 0 {
			t.Errorf("no registry request after the service account was re-created")
		}
	})

	t.Run("records revoke --service-account makes its pods verify again", func(t *testing.T) {
		out, err := p.records(t, "revoke", "--service-account", "sa-b/builder")
		if err != nil || !strings.Contains(out, "in 1 record(s)") {
			t.Fatalf("%v\n%s", err, out)
		}
		if b1.pullCountingRequests(t, p.ep, img) == 0 {
			t.Errorf("no registry request after the revoke")
		}
	})

	t.Run("Never pods: entitled ones (by service account or pull secret) start, another is refused", func(t *testing.T) {
		// The IfNotPresent pods above could verify by pulling: while they wait
		// the image stays hidden. They are done: remove them.
		zero := int64(0)
		for _, tn := range []apiTenant{a1, a2, b1, n1} {
			k.Admin.CoreV1().Pods(tn.pod.Namespace).Delete(ctx, tn.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		// A pull secret verified by a pull with credentials.
		secretJSON, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": "alice", "password": rig.Users["alice"]}}})
		if _, err := k.Admin.CoreV1().Secrets("sa-a").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
			Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: secretJSON}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		withSecret := createPod(t, k, "sa-a", "s1", "plain", corev1.PullIfNotPresent, img, "regcred")
		withSecret.creds = "alice:" + rig.Users["alice"]
		if r := withSecret.pull(t, p.ep, img); r.Err != nil {
			t.Fatalf("%v\n%s", r.Err, r.Stderr)
		}
		k.Admin.CoreV1().Pods("sa-a").Delete(ctx, "s1", metav1.DeleteOptions{GracePeriodSeconds: &zero})

		bySA := createPod(t, k, "sa-a", "never-sa", "builder", corev1.PullNever, img)
		bySecret := createPod(t, k, "sa-a", "never-secret", "plain", corev1.PullNever, img, "regcred")
		nobody := createPod(t, k, "sa-a", "never-nobody", "plain", corev1.PullNever, img)
		// The service account was re-created above: verify it once more.
		waitUntil(t, 10*time.Second, func() error {
			if r := crictl(t, p.ep, "inspecti", img); r.Err != nil {
				return fmt.Errorf("still hidden: %s", r.Stderr)
			}
			return nil
		})
		start := func(tn apiTenant) error {
			podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", tn.config))
			t.Cleanup(func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) })
			ctr := containerConfig(t, "ctr-"+tn.pod.Name, img, "true")
			if _, passed, msg := createThrough(t, p.ep, podID, ctr, tn.config); !passed {
				return fmt.Errorf("%s", msg)
			}
			return nil
		}
		if err := start(bySecret); err != nil {
			t.Errorf("the Never pod with a verified pull secret: %v", err)
		}
		if err := start(nobody); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
			t.Errorf("the Never pod without entitlement: %v", err)
		}
		// bySA's account was re-created and then verified by a2's pull.
		if err := start(bySA); err != nil {
			t.Errorf("the Never pod whose service account is verified: %v", err)
		}
	})

	t.Run("no token or password reaches the database, the records or the log", func(t *testing.T) {
		db, err := os.ReadFile(p.db)
		if err != nil {
			t.Fatal(err)
		}
		export, _ := p.records(t, "export")
		// A service account token is a JWT: two base64url JSON objects.
		jwt := regexp.MustCompile(`eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+`)
		for what, text := range map[string]string{"the database": string(db), "records export": export, "the proxy log": p.proc.LogText()} {
			if jwt.MatchString(text) {
				t.Errorf("%s holds a token", what)
			}
			for _, pw := range []string{rig.Users["alice"], rig.Users["bob"]} {
				if strings.Contains(text, pw) {
					t.Errorf("%s holds a password", what)
				}
			}
		}
		if len(plugin.claims(t)) == 0 {
			t.Fatal("the plugin saw no token: nothing was checked")
		}
	})
}

// TestExecPluginKubeconfig runs the proxy with a kubeconfig whose user is
// an exec credential plugin (KEP-541): client-go runs it, and its metrics
// are on /metrics.
func TestExecPluginKubeconfig(t *testing.T) {
	k := needKube(t)
	createNamespace(t, k, "exec-a")
	createServiceAccount(t, k, "exec-a", "builder", "alice")
	pod := createPod(t, k, "exec-a", "e1", "builder", corev1.PullIfNotPresent, testRig.Registry+"/"+rig.TeamBImage)
	t.Cleanup(func() { crictl(t, direct(), "rmi", testRig.Registry+"/"+rig.TeamBImage) })
	kubeconfig, err := k.WriteExecKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	plugin := tokenPluginSetup(t)
	mon := freeAddr(t)
	ep, _ := startProxy(t, "exec", "--kubeconfig", kubeconfig, "--node-name", nodeName, "--monitoring-address", mon,
		"--image-credential-provider-config", plugin.config, "--image-credential-provider-bin-dir", plugin.binDir)
	if r := crictl(t, ep, "pull", "--pod-config", pod.config, testRig.Registry+"/"+rig.TeamBImage); r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Stderr)
	}
	_, metrics := httpGet(t, mon, "/metrics")
	// Prometheus sorts labels by name: code, host, method. A 201 POST is
	// the TokenRequest for the pod's service account.
	for _, want := range []string{`rest_client_exec_plugin_call_total{call_status="no_error",code="0"}`, "rest_client_exec_plugin_ttl_seconds", `rest_client_requests_total{code="201",host="127.0.0.1:`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !regexp.MustCompile(`rest_client_requests_total\{code="201",host="[^"]+",method="POST"\} [1-9]`).MatchString(metrics) {
		t.Errorf("metrics count no successful POST (the token request)")
	}
	if b, _ := os.ReadFile(filepath.Join(k.Dir, proxyUser+"-exec-credential.sh.calls")); len(b) == 0 {
		t.Errorf("the exec credential plugin never ran")
	}
}

// TestJSONLogsAreAllJSON runs the proxy with --log-format json and makes
// client-go log: its identity (node rig-node) watches the pods of another
// node, which the Node authorizer refuses, so the reflector reports it
// through klog. Every line of the log is one JSON object, those included.
func TestJSONLogsAreAllJSON(t *testing.T) {
	k := needKube(t)
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	_, p := startProxy(t, "json", "--log-format", "json", "--kubeconfig", kubeconfig, "--node-name", "someone-elses-node")
	var lines []string
	waitUntil(t, 60*time.Second, func() error {
		lines = strings.Split(strings.TrimSpace(p.LogText()), "\n")
		for _, l := range lines {
			if strings.Contains(l, "forbidden") && strings.Contains(l, "pods") {
				return nil
			}
		}
		return fmt.Errorf("no line from client-go's reflector yet")
	})
	for i, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("line %d is not JSON: %v\n%s", i+1, err, l)
		}
	}
}

// TestSecureMetrics scrapes the TLS /metrics endpoint as Prometheus in the
// cluster would: the proxy (the node's identity) asks the real apiserver
// who each bearer token is and whether it may get nodes/metrics of its
// node. No token: 401; a user without the right: 403; a user with it (a
// ClusterRole as Prometheus's): the metrics. No token reaches the log.
func TestSecureMetrics(t *testing.T) {
	k := needKube(t)
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-metrics"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/metrics"}, Verbs: []string{"get"}}}}
	if _, err := k.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: metricsReader}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	secure := freeAddr(t)
	_, p := startProxy(t, "secure-metrics", "--kubeconfig", kubeconfig, "--node-name", nodeName, "--secure-monitoring-address", secure)

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // self-signed
	scrape := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+secure+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name, path, token string
		code              int
		body              string
	}{
		{"no token: 401", "/metrics", "", 401, ""},
		{"a token the API does not know: 401", "/metrics", "not-a-token", 401, ""},
		{"a user without get nodes/metrics: 403", "/metrics", k.Tokens["nobody"], 403, "Forbidden"},
		{"a user with get nodes/metrics: the metrics", "/metrics", k.Tokens[metricsReader], 200, "cri_image_proxy_build_info"},
		{"only /metrics is served there", "/healthz", k.Tokens[metricsReader], 404, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, body := scrape(c.path, c.token); code != c.code || !strings.Contains(body, c.body) {
				t.Errorf("GET %s: %d, want %d containing %q\n%.300s", c.path, code, c.code, c.body, body)
			}
		})
	}
	if log := p.LogText(); strings.Contains(log, k.Tokens["nobody"]) || strings.Contains(log, k.Tokens[metricsReader]) {
		t.Errorf("a bearer token reached the proxy's log")
	}
}
