package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// pullCostScenarios put the registry check (issue #28) beside the pulls it
// stands before, with the registry 2 ms away (the ensure scenarios' relay):
// what it adds to a pull of a new image, and what it saves on a pull of an
// image already on the node, which it answers from the node on the
// registry's word where the runtime would re-check.
func pullCostScenarios() []measurement {
	needs := []part{ensureProxies}
	return []measurement{
		scenarioOf("ensure: PullImage of a new image c=1, registry 2 ms away: direct vs the registry check then the runtime's pull", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			pool, err := e.freshImages("registry.remote.test", 24)
			if err != nil {
				e.logf("pushing fresh images: %v", err)
			}
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage of a new image", call: freshPullCall(e, e.direct, pool, nil), cpu: []string{"containerd"}},
					{name: "ensure: the registry check, then the runtime's pull", call: freshPullCall(e, ee.small, pool, nil), cpu: []string{"proxy-ensure-100"}},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("the registry check adds %s (p50) to a pull of a new image that takes %s: %.2fx",
						r.p50Delta(1).Round(100*time.Microsecond), time.Duration(r.armMedian(0, func(s segment) float64 { return float64(s.quantile(0.5)) })).Round(time.Millisecond), r.p50Ratio(1))
				},
			}
		}),
		scenarioOf("ensure: PullImage(present) c=1 with credentials, registry 2 ms away: the runtime's re-check vs the registry check answering from the node", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage, credentials re-checked by the runtime", call: pullCall(e.direct, ee.remote, aliceAuth), cpu: []string{"containerd"}},
					{name: "ensure: the registry check, answered from the node", call: pullCall(ee.small, ee.remote, aliceAuth), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{{desc: "a pull of a present image through the registry check p50 <= 1.1x the runtime's re-check, registry 2 ms away", value: p50Ratio(1), max: 1.1}},
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
