package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/signtest"
)

// policyEnv is what the image policy scenarios need: a proxy
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
	// pool are new signed images, for the pulls; farPool are signed
	// images of a realistic size (realisticLayers random layers of
	// realisticLayerBytes) from a registry farDelay away (farRegistry).
	pool, farPool []string
	// nearPool are the farPool's images from a registry nearDelay away
	// (nearRegistry): a pull of realistic size from a registry as near as
	// the other rows'.
	nearPool            []string
	farRelay, nearRelay *rig.DelayRelay
	// config and binDir are the proxy's image policy configuration.
	config, binDir string
}

// The far registry of the realistic pulls: the rig's anonymous view, one
// network hop of farDelay each way away (a registry in another region, as
// the kubelet's SLO data's pulls of about 2 s are), reached by its name
// through a relay that delays without capping bandwidth.
const (
	farRegistry         = "far.rig.test"
	farDelay            = 10 * time.Millisecond // RTT 20 ms
	nearRegistry        = "near.rig.test"
	nearDelay           = time.Millisecond // RTT 2 ms, as the other rows' registry
	realisticLayers     = 5
	realisticLayerBytes = 7 << 20
	farPoolSize         = 6
)

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
	relay, err := rig.StartLatencyRelay(e.rig.AnonRegistry, farDelay)
	if err != nil {
		return err
	}
	if err := e.rig.AddMirror(farRegistry, relay.Port()); err != nil {
		return err
	}
	near, err := rig.StartLatencyRelay(e.rig.AnonRegistry, nearDelay)
	if err != nil {
		return err
	}
	if err := e.rig.AddMirror(nearRegistry, near.Port()); err != nil {
		return err
	}
	policy := filepath.Join(dir, "sigstore-policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
registries: [{host: %q, endpoint: "http://127.0.0.1:%d"}, {host: %q, endpoint: "http://127.0.0.1:%d"}]
policies:
  - name: signed
    namespaces: [%s, %s]
    authorities: [{name: release-key, key: {path: %s}}]
`, farRegistry, relay.Port(), nearRegistry, near.Port(), benchSecure, benchFirst, pub)), 0o644); err != nil {
		return err
	}
	config := filepath.Join(dir, "image-policy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
providers:
  - {name: sigstore-image-policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [%[1]q, %[5]q, %[6]q], namespaces: [%[2]s], args: [--policy, %[3]s]}
  - {name: sigstore-uncached, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [%[1]q, %[5]q, %[6]q], namespaces: [%[4]s], args: [--policy, %[3]s],
     allowCacheDuration: 0s, denyCacheDuration: 0s}
`, e.rig.AnonRegistry, benchSecure, policy, benchFirst, farRegistry, nearRegistry)), 0o644); err != nil {
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
	pe := &policyEnv{config: config, binDir: bin, farRelay: relay, nearRelay: near}
	e.logf("pushing %d signed images of %d MiB in %d layers", farPoolSize, realisticLayers*realisticLayerBytes>>20, realisticLayers)
	for i := range farPoolSize {
		repo := fmt.Sprintf("bench-far/app-%d", i)
		d, err := e.rig.PushRealistic(repo+":v1", fmt.Sprintf("far %d", i), realisticLayers, realisticLayerBytes)
		if err != nil {
			return err
		}
		if err := signtest.SignWithKey(ctx, e.rig.Registry+"/"+repo+"@"+d, key, signer); err != nil {
			return err
		}
		pe.farPool = append(pe.farPool, farRegistry+"/"+repo+":v1")
		pe.nearPool = append(pe.nearPool, nearRegistry+"/"+repo+":v1")
	}
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
	p, err := e.rig.StartProxy(e.opts.proxy, sock, append([]string{"--log-level", "info",
		"--ensure-secret-pulled-images", "--ensure-database", db, "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--image-policy-config", config, "--image-policy-bin-dir", bin}, e.profiled("proxy-ensure-policy")...)...)
	if err != nil {
		return err
	}
	e.extraProxies = append(e.extraProxies, p)
	pe.pid = p.Pid()
	if pe.cc, err = rig.DialCRI("unix://" + sock); err != nil {
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
// CreateContainer (the target: at most 5 us of proxy CPU), and the first
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
				notes: func(r *result) string {
					return fmt.Sprintf("proxy CPU per CreateContainer (its RemoveContainer, untimed, passes through too): %+.1f µs with the image policy, median of the rounds' differences; p50 ratio %.3f. "+
						"A process's CPU per call of a CreateContainer varies by tens of µs from round to round: the 5 µs bar is held in process (the next measurement)",
						cpuDeltaMicros(1, 0)(r), r.p50Ratio(1))
				},
			}
		}),
		signedPullScenario("image policy: PullImage of a new signed image c=1 (a small image, registry on loopback): no policy, its first verification, a cached verdict",
			func(pe *policyEnv) []string { return pe.pool }, nil),
		signedPullScenario(fmt.Sprintf("image policy: PullImage of a new realistic signed image c=1 (%d MiB in %d layers, registry %s away): no policy, its first verification, a cached verdict",
			realisticLayers*realisticLayerBytes>>20, realisticLayers, 2*nearDelay),
			func(pe *policyEnv) []string { return pe.nearPool },
			[]target{
				{desc: "a new signed image whose pull takes 500 ms or more: its pull with the image policy's first verification p50 <= 1.05x direct", value: p50Ratio(2), max: 1.05},
				{desc: "a new signed image whose pull takes 500 ms or more: its pull with a cached verdict p50 <= 1.05x the same pull without a policy", value: ratioOf(3, 1), max: 1.05},
			}),
		signedPullScenario(fmt.Sprintf("image policy: PullImage of a new realistic signed image c=1 (%d MiB in %d layers, registry %s away): no policy, its first verification, a cached verdict",
			realisticLayers*realisticLayerBytes>>20, realisticLayers, 2*farDelay),
			func(pe *policyEnv) []string { return pe.farPool },
			[]target{
				{desc: "a new realistic image, registry 20 ms away: its pull through the registry check p50 <= 1.02x direct", value: ratioOf(1, 0), max: 1.02},
				{desc: "a new realistic signed image, registry 20 ms away: its pull with the image policy's first verification p50 <= 1.05x direct", value: p50Ratio(2), max: 1.05},
			}),
	}
}

// signedPullScenario measures the pull of a new signed image from pool
// c=1: direct; through the ensure proxy in a namespace without a policy
// (the registry check beside the runtime's pull); in bench-first (the
// image policy decides on the digest the registry names before the
// runtime is asked: the HEAD, then the plugin's first verification, then
// the pull); and in bench-secure with the verdict cached (the HEAD, then
// the pull). Before the rounds, every image of the pool is pulled once in
// bench-secure, so that its verdict is cached there.
func signedPullScenario(name string, pool func(*policyEnv) []string, targets []target) measurement {
	return scenarioOf(name, []part{ensureProxies, policyProxy}, func(e *benchEnv) scenario {
		pe := e.policy
		images := pool(pe)
		return scenario{
			conc: 1,
			long: true,
			before: func() {
				c := runtimeapi.NewImageServiceClient(pe.cc)
				rm := runtimeapi.NewImageServiceClient(e.direct)
				for _, img := range images {
					ctx := context.Background()
					if _, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}, Auth: aliceAuth, SandboxConfig: podIn(benchSecure)}); err != nil {
						e.logf("  caching the verdict of %s: %v", img, err)
					}
					_, _ = rm.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: img}})
				}
			},
			arms: []arm{
				{name: "direct PullImage of a new image", call: freshPullCall(e, e.direct, images, nil), cpu: []string{"containerd"}},
				{name: "namespace without a policy: the registry check beside the runtime's pull", call: freshPullCall(e, pe.cc, images, podIn(benchOpen)), cpu: []string{"proxy-ensure-policy"}},
				{name: "namespace with a policy, its first verification: the registry's HEAD and the plugin, then the runtime's pull", call: freshPullCall(e, pe.cc, images, podIn(benchFirst)), cpu: []string{"proxy-ensure-policy"}},
				{name: "namespace with a policy, the verdict cached: the registry's HEAD, then the runtime's pull", call: freshPullCall(e, pe.cc, images, podIn(benchSecure)), cpu: []string{"proxy-ensure-policy"}},
			},
			targets: targets,
			notes: func(r *result) string {
				return fmt.Sprintf("a pull of %s direct; the first verification before the runtime's pull adds %s (p50): %.2fx direct; a cached verdict %.2fx direct, %.2fx the same pull without a policy (+%s); the check alone %.2fx direct (the plugin's own CPU, a child process, is not in the proxy's column)",
					time.Duration(r.armMedian(0, func(s segment) float64 { return float64(s.quantile(0.5)) })).Round(time.Millisecond),
					r.p50Delta(2).Round(100*time.Microsecond), r.p50Ratio(2), r.p50Ratio(3), ratioOf(3, 1)(r),
					(r.p50Delta(3) - r.p50Delta(1)).Round(100*time.Microsecond), r.p50Ratio(1))
			},
		}
	})
}

// guardCostMeasurement holds image policy's target: a cached verdict adds at most
// 5 µs of proxy CPU to a CreateContainer, where it can be resolved: the
// guard's CreateContainer in this process, with and without the image
// policy (the real engine, the plugin having run at the pull, the verdict
// bound), its runtime answering from memory what containerd answered for
// the image, and the call not forwarded. The rest of a CreateContainer (the
// gRPC transaction, the runtime's answer) is the same with and without.
var guardCostMeasurement = measurement{
	name:  "image policy: the guard's CPU per CreateContainer in process, verdict cached",
	needs: []part{ensureProxies, policyProxy},
	run: func(e *benchEnv, rep *report) error {
		alone, with, err := e.policyGuards()
		if err != nil {
			return err
		}
		pe := e.policy
		ctx := context.Background()
		req := &runtimeapi.CreateContainerRequest{PodSandboxId: pe.policyPod, SandboxConfig: pe.policyPodCfg,
			Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: e.ensure.public}}}
		resp := &runtimeapi.CreateContainerResponse{ContainerId: "not-created"}
		next := func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			return resp, nil
		}
		// cost is the CPU of this process per call, over a segment of calls
		// made one after another.
		cost := func(g *ensure.Guard) (time.Duration, error) {
			d := time.Duration(e.opts.seconds * float64(time.Second))
			n, cpu0, stop := 0, processCPU(0), time.Now().Add(d)
			for ; time.Now().Before(stop); n++ {
				if _, err := g.CreateContainer(ctx, req, next); err != nil {
					return 0, err
				}
			}
			return (processCPU(0) - cpu0) / time.Duration(n), nil
		}
		// The daemon's garbage collector setting (GOGC=300, its default),
		// not the bench's: the calls' garbage is part of their cost.
		defer debug.SetGCPercent(debug.SetGCPercent(300))
		var deltas, aloneNs, withNs []float64
		for range e.opts.rounds {
			a, err := cost(alone)
			if err != nil {
				return fmt.Errorf("ensure alone: %w", err)
			}
			w, err := cost(with)
			if err != nil {
				return fmt.Errorf("ensure with the image policy: %w", err)
			}
			aloneNs, withNs, deltas = append(aloneNs, float64(a)), append(withNs, float64(w)), append(deltas, float64(w-a))
		}
		delta := median(deltas) / 1e3
		rep.extra = append(rep.extra, extraTarget{desc: "a cached image policy verdict adds <= 5 µs of CPU to the guard's CreateContainer (in process, median of rounds)", value: delta, max: 5})
		rep.sections = append(rep.sections, fmt.Sprintf("\n## Image policy at CreateContainer, in process\n\n"+
			"The guard's CreateContainer, calls one after another for a segment per arm and round (%d rounds), the runtime answering from memory, the call not forwarded, GOGC=300 as in the daemon; CPU of the process per call: "+
			"ensure alone %.1f µs, ensure with the image policy (verdict cached) %.1f µs, the policy's share %+.2f µs (median of the rounds' differences).\n",
			e.opts.rounds, median(aloneNs)/1e3, median(withNs)/1e3, delta))
		return nil
	},
}

// policyGuards are two guards in this process on the image of the
// CreateContainer scenario, as containerd lists it: ensure alone, and
// ensure with the image policy of the policy proxy, whose verdict the pull
// of a pod of bench-secure (through the guard: the registry check, the
// plugin) bound to the image ID.
func (e *benchEnv) policyGuards() (alone, with *ensure.Guard, err error) {
	ctx := context.Background()
	st, err := runtimeapi.NewImageServiceClient(e.direct).ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: e.ensure.public}})
	if err != nil || st.Image == nil {
		return nil, nil, fmt.Errorf("ImageStatus %s: %v", e.ensure.public, err)
	}
	img := crireq.Image{ID: st.Image.Id, Names: append(append([]string{}, st.Image.RepoTags...), st.Image.RepoDigests...)}
	cfg, err := imagepolicy.LoadConfig(e.policy.config, e.policy.binDir)
	if err != nil {
		return nil, nil, err
	}
	engine, err := imagepolicy.New(cfg, imagepolicy.Options{Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		return nil, nil, err
	}
	checker, err := registry.New(registry.Options{HostsDir: e.rig.HostsDir()})
	if err != nil {
		return nil, nil, err
	}
	direct := runtimeapi.NewImageServiceClient(e.direct)
	pull := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.ensure.public}, SandboxConfig: e.policy.policyPodCfg}
	var guards []*ensure.Guard
	for _, policy := range []ensure.ImagePolicy{nil, cri.NewGate(engine, nil, nil)} {
		p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
		store, err := records.Open(filepath.Join(e.work, fmt.Sprintf("guard-%d.db", len(guards))), records.Options{})
		if err != nil {
			return nil, nil, err
		}
		g, err := ensure.NewGuard(store, p, memoryRuntime{img}, ensure.GuardOptions{Registry: checker, ImagePolicy: policy})
		if err != nil {
			return nil, nil, err
		}
		if _, err := g.PullImage(ctx, pull, func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
			return direct.PullImage(ctx, r)
		}); err != nil {
			return nil, nil, fmt.Errorf("the guard's pull of %s: %w", e.ensure.public, err)
		}
		guards = append(guards, g)
	}
	return guards[0], guards[1], nil
}

// memoryRuntime is a runtime with one image, answered from memory.
type memoryRuntime struct{ img crireq.Image }

func (m memoryRuntime) Image(context.Context, crireq.ImageQuery) (crireq.Image, bool, error) {
	return m.img, true, nil
}
func (m memoryRuntime) Images(context.Context) ([]crireq.Image, error) {
	return []crireq.Image{m.img}, nil
}
func (m memoryRuntime) PodUID(context.Context, string) (string, error) { return "", nil }
func (m memoryRuntime) RuntimeID(id string) string                     { return id }

// ImageLayers: the bench's image has no layers of note.
func (m memoryRuntime) ImageLayers(context.Context, string) ([]digest.Digest, bool, error) {
	return []digest.Digest{}, true, nil
}
func (m memoryRuntime) PodUIDs(context.Context) (map[string]bool, error) {
	return map[string]bool{}, nil
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
