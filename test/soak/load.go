package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// podSteps is how many steps a tenant's pod serves before it is replaced.
const podSteps = 5

// soakImage is one image of a tenant.
type soakImage struct {
	path string // relative to the registry, as pushed
	name string // as the tenant pulls it
	repo string // its repository, as records key it
}

// imageState is what the soak knows of one image: what the node and the
// database should hold, as the tenant's own calls left them. A call that
// failed leaves it unknown, until the next one that succeeds.
type imageState struct {
	id        string // image ID, once pulled
	onNode    bool   // pulled, not removed since
	known     bool   // onNode is known (no call of it failed since)
	pulls     int    // pulls through the proxy that succeeded
	fresh     int    // of which went to the registry (the image was not on the node)
	removedAt time.Time
	viaProxy  bool // the last removal was through the proxy
}

// tenant is a pod owner of the node with images of its own.
type tenant struct {
	name     string
	private  bool // pulls with credentials in the request
	auth     *runtimeapi.AuthConfig
	registry string // the name it pulls the registry by
	images   []soakImage

	mu      sync.Mutex // held for a step: the leak check reads a quiet tenant
	next    int
	present []int // indexes of images on the node, oldest first
	states  []imageState
	pod     *pod
	removes int
	steps   int
}

// pod is a tenant's pod sandbox through the proxy.
type pod struct {
	id     string
	config *runtimeapi.PodSandboxConfig
	uses   int
}

func newTenants(e *env) []*tenant {
	r := e.rig
	ts := []*tenant{
		{name: "alice", private: true, auth: &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}, registry: r.Registry},
		{name: "bob", private: true, auth: &runtimeapi.AuthConfig{Username: "bob", Password: rig.Users["bob"]}, registry: r.Registry},
		{name: "plugin", registry: pluginRegistry},
		{name: "anon", registry: r.AnonRegistry},
	}
	for i := 0; i < e.o.images; i++ {
		t := ts[i%len(ts)]
		path := fmt.Sprintf("soak/%s/img-%04d", t.name, i/len(ts))
		t.images = append(t.images, soakImage{path: path + ":v1", name: t.registry + "/" + path + ":v1", repo: t.registry + "/" + path})
	}
	for _, t := range ts {
		t.states = make([]imageState, len(t.images))
	}
	return ts
}

// counters are the soak's own counts of what it did.
type counters struct {
	steps, pulls, freshPulls, reuses, containers atomic.Int64
	removedProxy, removedDirect, pods            atomic.Int64
	reloads, restarts, leakChecks                atomic.Int64
	mu                                           sync.Mutex
	errors                                       map[string]int    // by operation
	firstErrors                                  map[string]string // the first message of each
}

func (c *counters) fail(op string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.errors == nil {
		c.errors, c.firstErrors = map[string]int{}, map[string]string{}
	}
	c.errors[op]++
	if _, ok := c.firstErrors[op]; !ok {
		c.firstErrors[op] = err.Error()
		logf("%s failed (first of its kind; the rest are counted): %v", op, err)
	}
}

func (c *counters) errorCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.errors {
		n += v
	}
	return n
}

// soakResult is what the load left for the checks.
type soakResult struct {
	samples []sample
	began   time.Time
	ended   time.Time
	leaks   []string // found by the checks during the run
}

// soak runs the load for the duration, sampling meanwhile.
func (e *env) soak(tenants []*tenant) *soakResult {
	res := &soakResult{began: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), e.o.duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, t := range tenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.work1(ctx, t)
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); e.reloads(ctx) }()
	go func() { defer wg.Done(); e.restarts(ctx) }()

	var leakMu sync.Mutex
	sampleOnce := func() {
		s := e.sample(res.began)
		res.samples = append(res.samples, s)
		logf("sample %d at %v: %s", len(res.samples), s.at.Round(time.Second), s.brief())
	}
	sampleOnce()
	tick := time.NewTicker(e.o.interval)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			sampleOnce()
			// A light leak check: a few images of each private tenant.
			for _, t := range tenants {
				if l := e.leakCheck(ctx, t, 3, nil); len(l) > 0 {
					leakMu.Lock()
					res.leaks = append(res.leaks, l...)
					leakMu.Unlock()
				}
			}
		}
	}
	wg.Wait()
	res.ended = time.Now()
	// The runtime may have been stopped when the load ended.
	e.ensureRuntime()
	sampleOnce()
	return res
}

// work1 runs a tenant's steps until ctx is done.
func (e *env) work1(ctx context.Context, t *tenant) {
	for ctx.Err() == nil {
		ok := e.step(ctx, t)
		pause := e.o.think
		if !ok {
			pause = time.Second // the runtime is restarting, most likely
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pod != nil {
		e.removePod(context.Background(), t.pod)
		t.pod = nil
	}
}

// callCtx bounds one CRI call: a restart makes calls fail, none hangs.
func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// step is one of a kubelet's pod starts for the tenant: the next image of
// its rotation pulled and run, an image it holds re-used, the oldest
// removed past its window. It reports whether every call succeeded.
func (e *env) step(ctx context.Context, t *tenant) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.counters.steps.Add(1)
	t.steps++
	ok := true
	if t.pod == nil || t.pod.uses >= podSteps {
		if t.pod != nil {
			e.removePod(ctx, t.pod)
			t.pod = nil
		}
		p, err := e.newPod(ctx, t.name, fmt.Sprintf("%s-%d", t.name, t.steps))
		if err != nil {
			e.counters.fail("RunPodSandbox", err)
			return false
		}
		t.pod = p
	}
	t.pod.uses++
	i := t.next % len(t.images)
	t.next++
	ok = e.use(ctx, t, i) && ok
	// A re-use of an image pulled before, in the same pod (the private
	// tenants': answered from the node after the hide).
	if len(t.present) > 1 {
		j := t.present[rand.IntN(len(t.present)-1)]
		ok = e.use(ctx, t, j) && ok
	}
	for len(t.present) > e.o.window {
		ok = e.removeOldest(ctx, t) && ok
	}
	return ok
}

// use pulls image i as the kubelet would for the tenant's pod
// (IfNotPresent) and runs a container of it there.
func (e *env) use(ctx context.Context, t *tenant, i int) bool {
	img, st := t.images[i], &t.states[i]
	images := runtimeapi.NewImageServiceClient(e.proxied)
	cctx, cancel := callCtx(ctx)
	defer cancel()
	status, err := images.ImageStatus(cctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.name}})
	if err != nil {
		e.counters.fail("ImageStatus", err)
		return false
	}
	if status.Image == nil {
		wasOn := st.onNode && st.known
		resp, err := images.PullImage(cctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img.name},
			Auth: t.auth, SandboxConfig: t.pod.config})
		if err != nil {
			st.known = false
			e.counters.fail("PullImage", err)
			return false
		}
		e.counters.pulls.Add(1)
		st.pulls++
		if !wasOn {
			e.counters.freshPulls.Add(1)
			st.fresh++
		} else {
			e.counters.reuses.Add(1)
		}
		st.id = resp.ImageRef
		st.onNode, st.known = true, true
		if !slicesContains(t.present, i) {
			t.present = append(t.present, i)
		}
	} else {
		st.id = status.Image.Id
		if !st.onNode || !st.known {
			// Shown and on the node: a public image present already
			// (pulled by an earlier step whose answer was lost).
			st.onNode, st.known = true, true
			if !slicesContains(t.present, i) {
				t.present = append(t.present, i)
			}
		}
	}
	return e.runContainer(ctx, t.pod, img.name)
}

// runContainer creates, starts, stops and removes a container of image in
// pod, through the proxy.
func (e *env) runContainer(ctx context.Context, p *pod, image string) bool {
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)
	cctx, cancel := callCtx(ctx)
	defer cancel()
	n := e.counters.containers.Add(1)
	c, err := rt.CreateContainer(cctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, SandboxConfig: p.config,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c-%d", n)},
			Image: &runtimeapi.ImageSpec{Image: image}, Command: []string{"true"},
			LogPath: fmt.Sprintf("c-%d.log", n), Linux: &runtimeapi.LinuxContainerConfig{}}})
	if err != nil {
		e.counters.fail("CreateContainer", err)
		return false
	}
	ok := true
	if _, err := rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		e.counters.fail("StartContainer", err)
		ok = false
	}
	if _, err := rt.StopContainer(cctx, &runtimeapi.StopContainerRequest{ContainerId: c.ContainerId}); err != nil {
		e.counters.fail("StopContainer", err)
		ok = false
	}
	// containerd may still call the container running for a moment after
	// StopContainer answered (seen: "container is still running, to stop
	// first"); the kubelet tries again, and so does the soak, once.
	for try := 0; ; try++ {
		_, err := rt.RemoveContainer(cctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.ContainerId})
		if err == nil {
			break
		}
		if try == 0 && strings.Contains(err.Error(), "still running") {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		e.counters.fail("RemoveContainer", err)
		ok = false
		break
	}
	return ok
}

// removeOldest removes the tenant's oldest image by ID: in turn through
// the proxy and directly on the runtime.
func (e *env) removeOldest(ctx context.Context, t *tenant) bool {
	i := t.present[0]
	t.present = t.present[1:]
	st := &t.states[i]
	t.removes++
	viaProxy := t.removes%2 == 0
	conn := e.direct
	op := "RemoveImage (runtime)"
	if viaProxy {
		conn, op = e.proxied, "RemoveImage (proxy)"
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := runtimeapi.NewImageServiceClient(conn).RemoveImage(cctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: st.id}}); err != nil {
		st.known = false
		e.counters.fail(op, err)
		return false
	}
	if viaProxy {
		e.counters.removedProxy.Add(1)
	} else {
		e.counters.removedDirect.Add(1)
	}
	st.onNode, st.known, st.removedAt, st.viaProxy = false, true, time.Now(), viaProxy
	return true
}

// newPod starts a pod sandbox through the proxy: host network, as the
// e2e tests' pods.
func (e *env) newPod(ctx context.Context, namespace, name string) (*pod, error) {
	logDir := filepath.Join(e.work, "pod-logs", name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "soak-" + namespace, Uid: fmt.Sprintf("%s-%d", name, time.Now().UnixNano()), Attempt: 1},
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	sb, err := runtimeapi.NewRuntimeServiceClient(e.proxied).RunPodSandbox(cctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		os.RemoveAll(logDir)
		return nil, err
	}
	e.counters.pods.Add(1)
	return &pod{id: sb.PodSandboxId, config: cfg}, nil
}

// removePod stops and removes a pod through the proxy; a failure is
// counted, and the pod is left to the rig's stop.
func (e *env) removePod(ctx context.Context, p *pod) {
	rt := runtimeapi.NewRuntimeServiceClient(e.proxied)
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := rt.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		e.counters.fail("StopPodSandbox", err)
		return
	}
	if _, err := rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		e.counters.fail("RemovePodSandbox", err)
		return
	}
	os.RemoveAll(p.config.LogDirectory)
}

// reloads sends the proxy SIGHUP every reloadEvery, its credential
// provider configuration changed first.
func (e *env) reloads(ctx context.Context) {
	tick := time.NewTicker(e.o.reloadEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := e.writeProviders(filepath.Join(e.work, "docker-config.json"), n); err != nil {
			e.counters.fail("reload", err)
			continue
		}
		if err := e.sighup(); err != nil {
			e.counters.fail("reload", err)
			continue
		}
		e.counters.reloads.Add(1)
	}
}

// restarts stops and starts the runtime every restartEvery, the load
// going on meanwhile.
func (e *env) restarts(ctx context.Context) {
	tick := time.NewTicker(e.o.restartEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < time.Minute {
			return // not in the run's last minute: the checks follow
		}
		e.runtimeMu.Lock()
		start := time.Now()
		e.rig.StopRuntime()
		err := e.rig.StartRuntime()
		e.runtimeMu.Unlock()
		if err != nil {
			e.counters.fail("runtime restart", err)
			continue
		}
		n := e.counters.restarts.Add(1)
		logf("runtime restart %d took %v", n, time.Since(start).Round(time.Millisecond))
	}
}

// ensureRuntime starts the runtime if a restart left it stopped.
func (e *env) ensureRuntime() {
	e.runtimeMu.Lock()
	defer e.runtimeMu.Unlock()
	if p := e.rig.RuntimeProc(); p == nil || !p.Alive() {
		if err := e.rig.StartRuntime(); err != nil {
			e.counters.fail("runtime restart", err)
		}
	}
}

func slicesContains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// errorSummary lists the failed calls by operation, with the first
// message of each.
func (c *counters) errorSummary() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for op, n := range c.errors {
		out = append(out, fmt.Sprintf("%s: %d (first: %s)", op, n, strings.ReplaceAll(c.firstErrors[op], "\n", " ")))
	}
	sort.Strings(out)
	return out
}
