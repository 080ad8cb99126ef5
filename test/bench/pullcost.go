package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// pullCostScenarios put the registry check (package registry) beside the pulls it
// stands before, with the registry 2 ms away (the ensure scenarios' relay):
// what it adds to a pull of a new image, and what it saves on a pull of an
// image already on the node, which it answers from the node on the
// registry's word where the runtime would re-check.
func pullCostScenarios() []measurement {
	needs := []part{ensureProxies}
	return []measurement{
		scenarioOf("ensure: PullImage of a new image c=1, registry 2 ms away: direct vs the registry check beside the runtime's pull", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			pool, err := e.freshImages("registry.remote.test", 24)
			if err != nil {
				e.logf("pushing fresh images: %v", err)
			}
			tally := newRegistryTally(e)
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage of a new image", call: tally.count(0, freshPullCall(e, e.direct, pool, nil)), cpu: []string{"containerd"}},
					{name: "ensure: the registry check beside the runtime's pull", call: tally.count(1, freshPullCall(e, ee.small, pool, nil)), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{
					{desc: "a new image's pull through the registry check p50 <= 1.05x direct, registry 2 ms away", value: p50Ratio(1), max: 1.05},
					{desc: "manifest GETs per pull beyond the runtime's own (Docker Hub counts each as a pull) <= 0", value: func(*result) float64 { return tally.extraManifestGets(0, 1) }, max: 0},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("the registry check adds %s (p50) to a pull of a new image that takes %s: %.2fx. %s",
						r.p50Delta(1).Round(100*time.Microsecond), time.Duration(r.armMedian(0, func(s segment) float64 { return float64(s.quantile(0.5)) })).Round(time.Millisecond), r.p50Ratio(1),
						tally.summary([]string{"direct", "through the check"}))
				},
			}
		}),
		scenarioOf("ensure: PullImage(present) c=1 with credentials, registry 2 ms away: the runtime's re-check vs the registry check answering from the node", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			tally := newRegistryTally(e)
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage, credentials re-checked by the runtime", call: tally.count(0, pullCall(e.direct, ee.remote, aliceAuth)), cpu: []string{"containerd"}},
					{name: "ensure: the registry check, answered from the node", call: tally.count(1, pullCall(ee.small, ee.remote, aliceAuth)), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{{desc: "a pull of a present image through the registry check p50 <= 1.1x the runtime's re-check, registry 2 ms away", value: p50Ratio(1), max: 1.1}},
				notes: func(*result) string {
					return tally.summary([]string{"the runtime's re-check", "the registry check"})
				},
			}
		}),
	}
}

// freshImages pushes n images of their own (busybox and a marker layer) to
// the rig's registry and names them under host (a mirror of it in
// containerd's hosts.toml): each arm pulls one it does not have.
func (e *benchEnv) freshImages(host string, n int) ([]string, error) {
	var out []string
	for i := range n {
		ref := fmt.Sprintf("bench-fresh/app-%d:v1", i)
		if _, err := e.rig.PushBusybox(ref, fmt.Sprintf("fresh %d", i)); err != nil {
			return nil, err
		}
		out = append(out, host+"/"+ref)
	}
	return out, nil
}

// freshPullCall makes calls that each pull the next image of pool through
// cc with alice's credential (for pod, when not nil), timed alone, then
// remove it from the node (untimed), so that the next use of it is a new
// pull again.
func freshPullCall(e *benchEnv, cc *grpc.ClientConn, pool []string, pod *runtimeapi.PodSandboxConfig) call {
	var next atomic.Int64
	c := runtimeapi.NewImageServiceClient(cc)
	rm := runtimeapi.NewImageServiceClient(e.direct)
	return timed(func(ctx context.Context) (time.Duration, error) {
		if len(pool) == 0 {
			return 0, fmt.Errorf("no fresh images to pull")
		}
		img := pool[int(next.Add(1)-1)%len(pool)]
		start := time.Now()
		_, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}, Auth: aliceAuth, SandboxConfig: pod})
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		_, err = rm.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: img}})
		return took, err
	})
}

// registryTally counts, per arm, what each call asked the rig's registry
// (its access log): requests, manifest GETs (what Docker Hub counts as a
// pull), and the bytes it served (the relay's count).
type registryTally struct {
	e  *benchEnv
	mu sync.Mutex
	// per arm: calls, requests, manifest GETs, bytes
	calls, requests, manifestGets, bytes map[int]int64
}

func newRegistryTally(e *benchEnv) *registryTally {
	return &registryTally{e: e, calls: map[int]int64{}, requests: map[int]int64{}, manifestGets: map[int]int64{}, bytes: map[int]int64{}}
}

// count wraps arm's call: what the registry answered during it is the arm's.
func (t *registryTally) count(arm int, c call) call {
	return func(ctx context.Context) error {
		before, _ := t.e.rig.RegistryRequests()
		served := t.e.ensure.relay.Served()
		err := c(ctx)
		after, _ := t.e.rig.RegistryRequests()
		if err != nil || len(after) < len(before) {
			return err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		t.calls[arm]++
		t.bytes[arm] += t.e.ensure.relay.Served() - served
		for _, r := range after[len(before):] {
			t.requests[arm]++
			if r.Method == "GET" && strings.Contains(r.Path, "/manifests/") {
				t.manifestGets[arm]++
			}
		}
		return nil
	}
}

func (t *registryTally) per(m map[int]int64, arm int) float64 {
	if t.calls[arm] == 0 {
		return 0
	}
	return float64(m[arm]) / float64(t.calls[arm])
}

// extraManifestGets is arm's manifest GETs per call beyond base's.
func (t *registryTally) extraManifestGets(base, arm int) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.per(t.manifestGets, arm) - t.per(t.manifestGets, base)
}

// summary says, per arm, the registry's requests, manifest GETs and bytes
// per call.
func (t *registryTally) summary(names []string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for arm, n := range names {
		parts = append(parts, fmt.Sprintf("%s: %.1f requests, %.1f manifest GETs, %.0f bytes per pull", n,
			t.per(t.requests, arm), t.per(t.manifestGets, arm), t.per(t.bytes, arm)))
	}
	return "at the registry, " + strings.Join(parts, "; ")
}
