package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig"
	"github.com/cri-image-proxy/cri-image-proxy/internal/signtest"
)

// policyEnv is what the image policy scenarios (#23) need: a proxy
// enforcing ensure with an image policy, the reference plugin
// (sigstore-image-policy) requiring a signature by the bench's key in
// namespace bench-secure (verdicts cached, as configured by default) and
// in namespace bench-first (nothing cached: every pull is a first
// verification), beside the ensure proxy of 100 records without one.
type policyEnv struct {
	cc  *grpc.ClientConn
	pid int
	// sandboxes of each proxy, for CreateContainer: the policy proxy's in
	// bench-secure, the ensure proxy's in bench.
	policyPod, ensurePod       string
	policyPodCfg, ensurePodCfg *runtimeapi.PodSandboxConfig
	// pool are new signed images, for the pulls.
	pool []string
}

// The namespaces of the image policy scenarios.
const (
	benchSecure = "bench-secure" // a signature required, verdicts cached
	benchFirst  = "bench-first"  // a signature required, nothing cached
	benchOpen   = "bench-open"   // no policy
)

func (e *benchEnv) setUpPolicy() error {
	dir := filepath.Join(e.work, "image-policy")
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	e.logf("building sigstore-image-policy")
	for _, plugin := range []string{"sigstore-image-policy", "sigstore-uncached"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, plugin), "./cmd/sigstore-image-policy").CombinedOutput(); err != nil {
			return fmt.Errorf("build: %v: %s", err, out)
		}
	}
	key, err := signtest.NewKey()
	if err != nil {
		return err
	}
	pub := filepath.Join(dir, "release.pub")
	if err := os.WriteFile(pub, key.PublicKeyPEM(), 0o644); err != nil {
		return err
	}
	policy := filepath.Join(dir, "sigstore-policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
policies:
  - name: signed
    namespaces: [%s, %s]
    authorities: [{name: release-key, key: {path: %s}}]
`, benchSecure, benchFirst, pub)), 0o644); err != nil {
		return err
	}
	config := filepath.Join(dir, "image-policy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
providers:
  - {name: sigstore-image-policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [%[1]q], namespaces: [%[2]s], args: [--policy, %[3]s]}
  - {name: sigstore-uncached, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [%[1]q], namespaces: [%[4]s], args: [--policy, %[3]s],
     allowCacheDuration: 0s, denyCacheDuration: 0s}
`, e.rig.AnonRegistry, benchSecure, policy, benchFirst)), 0o644); err != nil {
		return err
	}

	// The public image of the ensure scenarios, signed; and the pool.
	auth := remote.WithAuth(&authn.Basic{Username: "user", Password: rig.Users["user"]})
	ref, err := name.ParseReference(e.rig.Registry+"/"+rig.TeamBImage, name.Insecure)
	if err != nil {
		return err
	}
	desc, err := remote.Head(ref, auth)
	if err != nil {
		return err
	}
	signer := signtest.Options{Auth: &authn.Basic{Username: "user", Password: rig.Users["user"]}}
	ctx := context.Background()
	if err := signtest.SignWithKey(ctx, ref.Context().Name()+"@"+desc.Digest.String(), key, signer); err != nil {
		return err
	}
	pe := &policyEnv{}
	for i := range 24 {
		repo := fmt.Sprintf("bench-policy/app-%d", i)
		d, err := e.rig.PushBusybox(repo+":v1", fmt.Sprintf("policy %d", i))
		if err != nil {
			return err
		}
		if err := signtest.SignWithKey(ctx, e.rig.Registry+"/"+repo+"@"+d, key, signer); err != nil {
			return err
		}
		pe.pool = append(pe.pool, e.rig.AnonRegistry+"/"+repo+":v1")
	}

	sock := filepath.Join(e.rig.Dir, "ensure-policy.sock")
	db := filepath.Join(dir, "ensure.db")
	if err := fillDatabase(db, 98); err != nil { // as the ensure proxy it is set beside
		return err
	}
	p, err := e.rig.StartProxy(e.opts.proxy, sock, "--log-level", "info",
		"--ensure-secret-pulled-images", "--ensure-database", db, "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--image-policy-config", config, "--image-policy-bin-dir", bin)
	if err != nil {
		return err
	}
	e.extraProxies = append(e.extraProxies, p)
	pe.pid = p.Pid()
	if pe.cc, err = dialCRI("unix://" + sock); err != nil {
		return err
	}
	e.pids["proxy-ensure-policy"] = pe.pid
	// The public image, pulled for a pod of bench-secure: the verdict is
	// bound to its image ID, and CreateContainer finds it cached.
	pe.policyPodCfg = benchPod(dir, "policy", benchSecure)
	if _, err := runtimeapi.NewImageServiceClient(pe.cc).PullImage(ctx, &runtimeapi.PullImageRequest{
		Image: &runtimeapi.ImageSpec{Image: e.ensure.public}, SandboxConfig: pe.policyPodCfg}); err != nil {
		return fmt.Errorf("ensure-policy: pull %s: %w", e.ensure.public, err)
	}
	pe.ensurePodCfg = benchPod(dir, "ensure", "bench")
	for _, s := range []struct {
		cc  *grpc.ClientConn
		cfg *runtimeapi.PodSandboxConfig
		id  *string
	}{{pe.cc, pe.policyPodCfg, &pe.policyPod}, {e.ensure.small, pe.ensurePodCfg, &pe.ensurePod}} {
		sb, err := runtimeapi.NewRuntimeServiceClient(s.cc).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: s.cfg})
		if err != nil {
			return fmt.Errorf("RunPodSandbox: %w", err)
		}
		*s.id = sb.PodSandboxId
	}
	e.policy = pe
	return nil
}

// benchPod is a pod sandbox config in namespace, on the host's network.
func benchPod(dir, name, namespace string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: name + "-uid"},
		LogDirectory: dir,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
}

// podIn is the sandbox config of a pod of namespace, for a pull.
func podIn(namespace string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "puller", Namespace: namespace, Uid: namespace + "-puller"}}
}

// policyScenarios measure what an image policy adds: a cached verdict at
// CreateContainer (#23's bar: at most 5 us of proxy CPU), and the first
// verification of a signed image at its pull, end to end, against the same
// pull in a namespace without a policy.
func policyScenarios() []measurement {
	needs := []part{ensureProxies, policyProxy}
	return []measurement{
		scenarioOf("image policy: CreateContainer c=1, ensure vs ensure with an image policy (verdict cached)", needs, func(e *benchEnv) scenario {
			pe := e.policy
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "ensure, no image policy", call: createContainerCall(e.ensure.small, pe.ensurePod, pe.ensurePodCfg, e.ensure.public), cpu: []string{"proxy-ensure-100"}},
					{name: "ensure and sigstore-image-policy, verdict cached", call: createContainerCall(pe.cc, pe.policyPod, pe.policyPodCfg, e.ensure.public), cpu: []string{"proxy-ensure-policy"}},
				},
				targets: []target{{desc: "a cached image policy verdict adds <= 5 µs of proxy CPU per CreateContainer (median over rounds)", value: cpuDeltaMicros(1, 0), max: 5}},
				notes: func(r *result) string {
					return fmt.Sprintf("proxy CPU per CreateContainer (its RemoveContainer, untimed, passes through too): %+.1f µs with the image policy; p50 ratio %.3f (the guard alone: BenchmarkGuardCreateContainer in package ensure)",
						cpuDeltaMicros(1, 0)(r), r.p50Ratio(1))
				},
			}
		}),
		scenarioOf("image policy: PullImage of a new signed image c=1: no policy vs its first verification (sigstore-image-policy, key)", needs, func(e *benchEnv) scenario {
			pe := e.policy
			return scenario{
				conc: 1,
				long: true,
				arms: []arm{
					{name: "namespace without a policy: the registry check, then the runtime's pull", call: freshPullCall(e, pe.cc, pe.pool, podIn(benchOpen)), cpu: []string{"proxy-ensure-policy"}},
					{name: "namespace with a policy: the registry check, the plugin verifies the signature, then the runtime's pull", call: freshPullCall(e, pe.cc, pe.pool, podIn(benchFirst)), cpu: []string{"proxy-ensure-policy"}},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("the first verification of a signed image adds %s (p50) to its pull of %s: %.2fx (the plugin's own CPU, a child process, is not in the proxy's column)",
						r.p50Delta(1).Round(100*time.Microsecond), time.Duration(r.armMedian(0, func(s segment) float64 { return float64(s.quantile(0.5)) })).Round(time.Millisecond), r.p50Ratio(1))
				},
			}
		}),
	}
}

// cpuDeltaMicros is arm a's CPU per call over arm b's, in µs, median over
// rounds (both in the same round).
func cpuDeltaMicros(a, b int) func(*result) float64 {
	return func(r *result) float64 {
		return r.perRound(func(round []segment) float64 {
			return float64(round[a].cpuPerCall(r.sc.arms[a].cpu...)-round[b].cpuPerCall(r.sc.arms[b].cpu...)) / 1e3
		})
	}
}

// closePolicy removes the sandboxes of the image policy scenarios.
func (e *benchEnv) closePolicy() {
	pe := e.policy
	if pe == nil {
		return
	}
	ctx := context.Background()
	rt := runtimeapi.NewRuntimeServiceClient(e.direct)
	for _, id := range []string{pe.policyPod, pe.ensurePod} {
		if id != "" {
			rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		}
	}
	if pe.cc != nil {
		pe.cc.Close()
	}
}
