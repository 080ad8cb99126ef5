package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// The token scenario's Kubernetes objects and the proxies' identity.
const (
	tokenNamespace = "bench"
	tokenAudience  = "registry.bench.test"
	tokenNode      = "bench-node"
	// tokenUser is the proxies' identity: a node's, as shipped, so the
	// Node authorizer and NodeRestriction apply (the pods are bound to
	// tokenNode, where no kubelet runs).
	tokenUser = "system:node:" + tokenNode
	// freshPods is how many pods the uncached arm can pull for, each once:
	// an uncached pull costs ~15 ms, so this outlasts 5 rounds of 1 s
	// plus warm-up several times over.
	freshPods = 1500
)

// tokenEnv is what the service-account token scenario needs: a real
// kube-apiserver and etcd, and two proxies with the SA-token test plugin.
// "cached" caches per service account: every pull of one pod after the
// first is a cache hit (a live GET of the account, as the kubelet does, and
// the pod's cached token). "fresh" caches per token and pulls for a new pod
// each call: each call mints a TokenRequest bound to that pod and execs
// the plugin, the cost of a pod's first pull.
type tokenEnv struct {
	kube          *kuberig.Kube
	cached, fresh *grpc.ClientConn
	cachedPod     *runtimeapi.PodSandboxConfig
	freshPods     []*runtimeapi.PodSandboxConfig
	next          atomic.Int64 // the next fresh pod
	countDir      string
	mark          int
}

func (e *benchEnv) setUpToken() error {
	// The token scenario's node, and the fleet's (fleet.go).
	users := append([]kuberig.User{{Name: tokenUser, Groups: []string{"system:nodes"}}}, fleetUsers(e.opts.fleetNodes)...)
	k, err := kuberig.Start(e.rig, kuberig.Options{Users: users})
	if err != nil {
		return err
	}
	te := &tokenEnv{kube: k, countDir: filepath.Join(e.work, "token")}
	e.token = te
	audiences, err := os.ReadFile("deploy/kubernetes/token-audiences.yaml")
	if err != nil {
		return err
	}
	if err := k.CreateRBAC([]byte(strings.ReplaceAll(string(audiences), "registry.example.com", tokenAudience))); err != nil {
		return fmt.Errorf("token-audiences.yaml: %w", err)
	}
	ctx := context.Background()
	if _, err := k.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tokenNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tokenNamespace, Name: "builder",
		Annotations: map[string]string{"registry.test/user": "alice"}}}
	if _, err := k.Admin.CoreV1().ServiceAccounts(tokenNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return err
	}
	e.logf("creating %d pods in the API", freshPods+1)
	pods, err := createBenchPods(ctx, k, e.presentImage, freshPods+1)
	if err != nil {
		return err
	}
	te.cachedPod, te.freshPods = pods[0], pods[1:]

	binDir := filepath.Join(te.countDir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	plugin := filepath.Join(e.work, "sa-token-credential-provider")
	if out, err := exec.Command("go", "build", "-o", plugin, "./cmd/sa-token-credential-provider").CombinedOutput(); err != nil {
		return fmt.Errorf("build plugin: %v: %s", err, out)
	}
	creds := filepath.Join(te.countDir, "credentials")
	if err := os.WriteFile(creds, []byte("alice:"+rig.Users["alice"]+"\n"), 0o600); err != nil {
		return err
	}
	kubeconfig, err := k.WriteKubeconfig(tokenUser)
	if err != nil {
		return err
	}
	for _, v := range []struct {
		name, cacheType string
		conn            **grpc.ClientConn
	}{{"cached", "ServiceAccount", &te.cached}, {"fresh", "Token", &te.fresh}} {
		if err := rig.WrapPlugin(filepath.Join(binDir, v.name), plugin, filepath.Join(te.countDir, v.name+".count")); err != nil {
			return err
		}
		cfg := filepath.Join(te.countDir, v.name+".yaml")
		y := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: %s
    matchImages: ["%s"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--for-tests-only", "--audience", "%s", "--credentials", "%s"]
    tokenAttributes:
      serviceAccountTokenAudience: %s
      cacheType: %s
      requireServiceAccount: true
      requiredServiceAccountAnnotationKeys: ["registry.test/user"]
`, v.name, e.rig.Registry, tokenAudience, creds, tokenAudience, v.cacheType)
		if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
			return err
		}
		sock := filepath.Join(e.rig.Dir, "bench-token-"+v.name+".sock")
		p, err := e.rig.StartProxy(e.opts.proxy, sock, "--log-level", "info",
			"--kubeconfig", kubeconfig, "--node-name", tokenNode,
			"--image-credential-provider-config", cfg, "--image-credential-provider-bin-dir", binDir)
		if err != nil {
			return err
		}
		e.extraProxies = append(e.extraProxies, p)
		e.pids["proxy-token-"+v.name] = p.Pid()
		if *v.conn, err = rig.DialCRI("unix://" + sock); err != nil {
			return err
		}
	}
	e.pids["kube-apiserver"] = k.APIServerPid()
	return nil
}

// createBenchPods creates n pods of the builder account bound to the
// bench node, and returns their sandbox configs (name, namespace, UID).
func createBenchPods(ctx context.Context, k *kuberig.Kube, image string, n int) ([]*runtimeapi.PodSandboxConfig, error) {
	out := make([]*runtimeapi.PodSandboxConfig, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	no := false
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tokenNamespace, Name: fmt.Sprintf("p%d", i)},
				Spec: corev1.PodSpec{NodeName: tokenNode, ServiceAccountName: "builder", AutomountServiceAccountToken: &no,
					Containers: []corev1.Container{{Name: "app", Image: image}}}}
			p, err := k.Admin.CoreV1().Pods(tokenNamespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			out[i] = &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)}}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
}

func podPullCall(cc *grpc.ClientConn, image string, pod func() *runtimeapi.PodSandboxConfig) call {
	c := runtimeapi.NewImageServiceClient(cc)
	return func(ctx context.Context) error {
		_, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, SandboxConfig: pod()})
		return err
	}
}

// freshPod hands out each fresh pod once; past the last it starts over,
// and the scenario's note says so (those pulls have a cached token).
func (te *tokenEnv) freshPod() *runtimeapi.PodSandboxConfig {
	i := te.next.Add(1) - 1
	return te.freshPods[int(i)%len(te.freshPods)]
}

// tokenScenarios measure the token plugin's pulls, cached and a new pod's
// first.
func tokenScenarios() []measurement {
	return []measurement{scenarioOf("PullImage(present) c=1, token plugin: cached credential vs a new pod's first pull (TokenRequest + exec)", []part{kubeAPI}, func(e *benchEnv) scenario {
		te := e.token
		img := e.presentImage
		return scenario{
			conc: 1,
			arms: []arm{
				{name: "cached (per service account)", call: podPullCall(te.cached, img, func() *runtimeapi.PodSandboxConfig { return te.cachedPod }), cpu: []string{"proxy-token-cached"}},
				{name: "uncached (new pod: TokenRequest + exec)", call: podPullCall(te.fresh, img, te.freshPod), cpu: []string{"proxy-token-fresh"}},
				{name: "direct, with credentials (no proxy, no API)", call: pullCall(e.direct, img, aliceAuth), cpu: []string{"containerd"}},
			},
			before: func() { te.mark = execCount(te.countDir, "fresh") },
			notes: func(r *result) string {
				used := te.next.Load()
				wrapped := ""
				if used > int64(len(te.freshPods)) {
					wrapped = fmt.Sprintf("; %d pulls re-used a pod (cached token)", used-int64(len(te.freshPods)))
				}
				return fmt.Sprintf("uncached over cached: p50 ratio %.2f, +%s µs; cached over direct: p50 ratio %.2f; %d fresh-pod pulls, %d plugin execs, cached arm %d execs in all%s",
					ratioOf(1, 0)(r), us(r.p50Delta(1)), ratioOf(0, 2)(r), used, execCount(te.countDir, "fresh")-te.mark, execCount(te.countDir, "cached"), wrapped)
			},
		}
	})}
}
