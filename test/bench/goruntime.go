package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The Go runtime's settings under a mixed load: the proxy's defaults
// (GOGC=300, GOMAXPROCS=1, set in cmd/cri-image-proxy/main.go from the
// per-call figures) against the Go runtime's own (GOGC=100, GOMAXPROCS =
// the cores) and the two crossings. Each arm is a proxy of its own with
// ensure and credential injection; in each round every arm in turn
// carries the same load while the kubelet's calls are timed:
//   - 64 concurrent PullImage with credentials (a node starting many pods),
//   - ListImages of the 1000+ images, back to back,
//   - 8 concurrent PullImage without credentials, each an exec of the
//     node's credential plugin (cache duration 0): an exec storm,
//   - timed, one at a time as a kubelet makes them: ImageStatus, and
//     CreateContainer in a running sandbox (RemoveContainer untimed).

// goRuntimeSettings: the defaults stay only while they are no worse than
// Go's own at the tail, where a loaded node's kubelet feels them. Under
// this load the tail is the machine's (containerd, the registry and the
// plugins saturate both cores); runs differ by up to ±15% with no change,
// so the goal is 1.25: it catches a setting that starves the proxy, not
// noise. It uses the ensure proxies' public image and the plugin the
// injection proxies' set-up builds.
var goRuntimeSettings = measurement{
	name:  "go runtime",
	needs: []part{injectionProxies, ensureProxies},
	run: func(e *benchEnv, rep *report) error {
		e.logf("go runtime: the proxy's GOGC/GOMAXPROCS defaults against Go's own, under a mixed load")
		gr, err := e.goRuntime()
		if err != nil {
			return err
		}
		rep.sections = append(rep.sections, renderGoRuntime(gr))
		rep.extra = append(rep.extra,
			extraTarget{desc: "ImageStatus p99 under a mixed load, the proxy's runtime defaults / Go's own (goal 1.25)", value: gr.p99Ratio(0, 1, status), max: 1.25},
			extraTarget{desc: "CreateContainer p99 under a mixed load, the proxy's runtime defaults / Go's own (goal 1.25)", value: gr.p99Ratio(0, 1, create), max: 1.25})
		return nil
	},
}

// goRuntimeArm is one proxy and its Go runtime settings.
type goRuntimeArm struct {
	name   string
	env    []string
	proc   *rig.Proc
	cc     *grpc.ClientConn
	podCfg *runtimeapi.PodSandboxConfig
	podID  string
}

// mixedSegment is one arm's figures in one round.
type mixedSegment struct {
	status, create              segment
	pulls, lists, execs, errors int64 // background calls completed, and failed
	cpu                         time.Duration
	wall                        time.Duration
}

type goRuntimeResult struct {
	arms   []*goRuntimeArm
	rounds [][]mixedSegment
	peak   []float64 // VmHWM, MiB, at the end
}

func (e *benchEnv) setUpGoRuntime() ([]*goRuntimeArm, error) {
	cores := strconv.Itoa(runtime.NumCPU())
	arms := []*goRuntimeArm{
		{name: "defaults (GOGC=300, GOMAXPROCS=1)"},
		{name: "Go's own (GOGC=100, GOMAXPROCS=" + cores + ")", env: []string{"GOGC=100", "GOMAXPROCS=" + cores}},
		{name: "GOGC=300, GOMAXPROCS=" + cores, env: []string{"GOGC=300", "GOMAXPROCS=" + cores}},
		{name: "GOGC=100, GOMAXPROCS=1", env: []string{"GOGC=100", "GOMAXPROCS=1"}},
	}
	dir := filepath.Join(e.work, "goruntime")
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink(filepath.Join(e.work, "docker-config-credential-provider"), filepath.Join(binDir, "node-creds")); err != nil {
		return nil, err
	}
	dockerConfig := filepath.Join(dir, "config.json")
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{e.rig.Registry: map[string]string{"username": "alice", "password": rig.Users["alice"]}}})
	if err := os.WriteFile(dockerConfig, b, 0o600); err != nil {
		return nil, err
	}
	providers := filepath.Join(dir, "providers.json")
	b, _ = json.Marshal(map[string]any{"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
		"providers": []map[string]any{{"name": "node-creds", "matchImages": []string{e.rig.Registry}, "defaultCacheDuration": "0s",
			"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "args": []string{"--docker-config", dockerConfig}}}})
	if err := os.WriteFile(providers, b, 0o644); err != nil {
		return nil, err
	}
	ctx := context.Background()
	for i, a := range arms {
		armDir := filepath.Join(dir, strconv.Itoa(i))
		if err := os.MkdirAll(armDir, 0o755); err != nil {
			return nil, err
		}
		sock := filepath.Join(e.rig.Dir, fmt.Sprintf("goruntime-%d.sock", i))
		p, err := e.rig.StartProxyEnv(e.opts.proxy, sock, a.env, "--log-level", "info",
			"--ensure-secret-pulled-images", "--ensure-database", filepath.Join(armDir, "ensure.db"), "--admin-socket", filepath.Join(armDir, "admin.sock"),
			"--image-credential-provider-config", providers, "--image-credential-provider-bin-dir", binDir)
		if err != nil {
			return nil, err
		}
		e.extraProxies = append(e.extraProxies, p)
		a.proc = p
		if a.cc, err = rig.DialCRI("unix://" + sock); err != nil {
			return nil, err
		}
		// The public image, pulled without credentials: every pod may see it.
		if _, err := runtimeapi.NewImageServiceClient(a.cc).PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.ensure.public}}); err != nil {
			return nil, fmt.Errorf("%s: pull %s: %w", a.name, e.ensure.public, err)
		}
		a.podCfg = &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: fmt.Sprintf("mixed-%d", i), Namespace: "bench", Uid: fmt.Sprintf("mixed-%d", i)},
			LogDirectory: armDir,
			Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		}
		sb, err := runtimeapi.NewRuntimeServiceClient(a.cc).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: a.podCfg})
		if err != nil {
			return nil, fmt.Errorf("%s: RunPodSandbox: %w", a.name, err)
		}
		a.podID = sb.PodSandboxId
	}
	return arms, nil
}

// goRuntime runs the rounds, rotating the order of the arms.
func (e *benchEnv) goRuntime() (*goRuntimeResult, error) {
	arms, err := e.setUpGoRuntime()
	if err != nil {
		return nil, err
	}
	defer func() {
		ctx := context.Background()
		for _, a := range arms {
			if a.podID != "" {
				rt := runtimeapi.NewRuntimeServiceClient(a.cc)
				rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: a.podID})
				rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: a.podID})
			}
		}
	}()
	// CreateContainer takes some 100 ms under this load: 8 s segments give
	// each arm some 300 of them over 5 rounds, for a p99 that is not the
	// maximum of a handful.
	d := time.Duration(e.opts.seconds * 8 * float64(time.Second))
	r := &goRuntimeResult{arms: arms}
	for _, a := range arms { // warm-up, not recorded
		e.mixedSegment(a, d/4)
	}
	for i := 0; i < e.opts.rounds; i++ {
		round := make([]mixedSegment, len(arms))
		for k := range arms {
			j := (i + k) % len(arms)
			round[j] = e.mixedSegment(arms[j], d)
			if s := round[j]; s.status.errors+s.create.errors > 0 || s.errors > 0 {
				e.logf("  go runtime/%s: %d timed errors (first: %v, %v), %d background errors", arms[j].name,
					s.status.errors+s.create.errors, s.status.firstErr, s.create.firstErr, s.errors)
			}
		}
		r.rounds = append(r.rounds, round)
	}
	for _, a := range arms {
		r.peak = append(r.peak, memory(a.proc.Pid())["VmHWM"])
	}
	return r, nil
}

// mixedSegment runs the load against a for d and times the kubelet's calls.
func (e *benchEnv) mixedSegment(a *goRuntimeArm, d time.Duration) mixedSegment {
	ctx, cancel := context.WithCancel(context.Background())
	img := runtimeapi.NewImageServiceClient(a.cc)
	var s mixedSegment
	var pulls, lists, execs, errs atomic.Int64
	var wg sync.WaitGroup
	background := func(n int, count *atomic.Int64, f func() error) {
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if err := f(); err == nil {
						count.Add(1)
					} else if ctx.Err() == nil {
						errs.Add(1)
					}
				}
			}()
		}
	}
	withAuth := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.presentImage}, Auth: aliceAuth, SandboxConfig: a.podCfg}
	byPlugin := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.presentImage}}
	cpu0, start := processCPU(a.proc.Pid()), time.Now()
	background(64, &pulls, func() error { _, err := img.PullImage(ctx, withAuth); return err })
	background(1, &lists, func() error { _, err := img.ListImages(ctx, &runtimeapi.ListImagesRequest{}); return err })
	background(8, &execs, func() error { _, err := img.PullImage(ctx, byPlugin); return err })

	var timedWG sync.WaitGroup
	timedWG.Add(2)
	go func() { defer timedWG.Done(); s.status = runSegment(imageStatusCall(a.cc, e.ensure.public), 1, d, nil) }()
	go func() {
		defer timedWG.Done()
		s.create = runSegment(createContainerCall(a.cc, a.podID, a.podCfg, e.ensure.public), 1, d, nil)
	}()
	timedWG.Wait()
	cancel()
	wg.Wait()
	s.wall, s.cpu = time.Since(start), processCPU(a.proc.Pid())-cpu0
	s.pulls, s.lists, s.execs, s.errors = pulls.Load(), lists.Load(), execs.Load(), errs.Load()
	return s
}

// createContainerCall times a CreateContainer through cc in the sandbox
// podID (of podCfg), then removes the container untimed.
func createContainerCall(cc *grpc.ClientConn, podID string, podCfg *runtimeapi.PodSandboxConfig, image string) call {
	rt := runtimeapi.NewRuntimeServiceClient(cc)
	n := 0
	return timed(func(ctx context.Context) (time.Duration, error) {
		n++
		req := &runtimeapi.CreateContainerRequest{PodSandboxId: podID, SandboxConfig: podCfg, Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c%d", n)}, Image: &runtimeapi.ImageSpec{Image: image},
			Command: []string{"true"}, Linux: &runtimeapi.LinuxContainerConfig{}}}
		t := time.Now()
		c, err := rt.CreateContainer(ctx, req)
		d := time.Since(t)
		if err != nil {
			return d, err
		}
		_, err = rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.ContainerId})
		return d, err
	})
}

// median of f over the rounds, for arm a.
func (r *goRuntimeResult) median(a int, f func(mixedSegment) float64) float64 {
	var xs []float64
	for _, round := range r.rounds {
		xs = append(xs, f(round[a]))
	}
	return median(xs)
}

// pooled is arm a's latencies of one timed call over all rounds: the
// quantiles of the tail come from all of them, not from one round's few.
func (r *goRuntimeResult) pooled(a int, which func(mixedSegment) segment) segment {
	var all segment
	for _, round := range r.rounds {
		all.lat = append(all.lat, which(round[a]).lat...)
	}
	slices.Sort(all.lat)
	return all
}

func status(s mixedSegment) segment { return s.status }
func create(s mixedSegment) segment { return s.create }

// p99Ratio is arm a's pooled p99 of a timed call over arm b's.
func (r *goRuntimeResult) p99Ratio(a, b int, which func(mixedSegment) segment) float64 {
	return float64(r.pooled(a, which).quantile(0.99)) / float64(r.pooled(b, which).quantile(0.99))
}

func renderGoRuntime(r *goRuntimeResult) string {
	var b strings.Builder
	b.WriteString("\n## Go runtime settings under a mixed load\n\n")
	b.WriteString("Each arm a proxy with ensure and injection; per round every arm in turn under 64 concurrent pulls with credentials, ListImages(1000+) back to back and 8 concurrent pulls each exec'ing the credential plugin, while ImageStatus and CreateContainer are timed one at a time. Latency quantiles over all rounds' calls of an arm, ratios of those against the defaults; rates and CPU medians over rounds.\n\n")
	b.WriteString("| arm | ImageStatus p50 / p99 µs | CreateContainer p50 / p99 ms | ImageStatus p99 ratio | CreateContainer p99 ratio | pulls/s | lists/s | plugin execs/s | proxy CPU s/s | peak RSS MiB |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for a, arm := range r.arms {
		per := func(n func(mixedSegment) int64) float64 {
			return r.median(a, func(s mixedSegment) float64 { return float64(n(s)) / s.wall.Seconds() })
		}
		fmt.Fprintf(&b, "| %s | %s / %s | %.1f / %.1f | %.2f | %.2f | %.1f | %.1f | %.1f | %.2f | %.1f |\n", arm.name,
			us(r.pooled(a, status).quantile(0.5)), us(r.pooled(a, status).quantile(0.99)),
			float64(r.pooled(a, create).quantile(0.5))/1e6, float64(r.pooled(a, create).quantile(0.99))/1e6,
			r.p99Ratio(a, 0, status), r.p99Ratio(a, 0, create),
			per(func(s mixedSegment) int64 { return s.pulls }), per(func(s mixedSegment) int64 { return s.lists }),
			per(func(s mixedSegment) int64 { return s.execs }),
			r.median(a, func(s mixedSegment) float64 { return s.cpu.Seconds() / s.wall.Seconds() }), r.peak[a])
	}
	return b.String()
}
