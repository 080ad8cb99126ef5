package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// proofLayerBytes is the size of the private layer of the layer proof's
// images: the size of a typical application layer.
const proofLayerBytes = 8 << 20

// layerProofScenario measures what proving a copy's private layers costs:
// tenant B pulls, with a credential, a copy of tenant A's private image
// (its own config, A's layers, the registry holding them in B's
// repository) while A's image is on the node. The runtime builds B's
// image from A's snapshots and fetches no layer; the proxy fetches each
// private layer from B's repository, decompresses it and compares it with
// its diff_id. Its baseline is a pull of an image of the same shape on a
// node without its layers, straight to containerd: the runtime fetches
// and unpacks them. Both through the registry 2 ms away.
var layerProofScenario = scenarioOf("ensure: PullImage c=1 of a copy of a private image, registry 2 ms away: a new image's pull straight to containerd vs the copy's pull proving its private layers",
	[]part{ensureProxies}, (*benchEnv).layerProof)

func (e *benchEnv) layerProof() scenario {
	ee := e.ensure
	bob := &runtimeapi.AuthConfig{Username: "bob", Password: rig.Users["bob"]}
	copies, err := e.privateCopies(ee, 2)
	if err != nil {
		e.logf("pushing the layer proof's images: %v", err)
	}
	fresh, ferr := e.freshLargeImages(24)
	if ferr != nil {
		e.logf("pushing the layer proof's fresh images: %v", ferr)
	}
	var (
		mu    sync.Mutex
		bytes = map[int][]int64{} // arm -> bytes the registry served per pull
	)
	counted := func(arm int, f timedCall) call {
		return timed(func(ctx context.Context) (time.Duration, error) {
			before := ee.relay.Served()
			d, err := f(ctx)
			if err == nil {
				mu.Lock()
				bytes[arm] = append(bytes[arm], ee.relay.Served()-before)
				mu.Unlock()
			}
			return d, err
		})
	}
	return scenario{
		conc: 1,
		long: true,
		arms: []arm{
			{name: "direct PullImage of a new image (its layers fetched and unpacked)", call: counted(0, pullThenRemove(e.direct, e.direct, fresh, aliceAuth)), cpu: []string{"containerd"}},
			{name: "ensure: PullImage of a copy of a private image on the node (its private layer proven by its bytes)", call: counted(1, pullThenRemove(ee.small, ee.small, copies, bob)), cpu: []string{"proxy-ensure-100"}},
		},
		targets: []target{{desc: "a copy's pull proving its private layers p50 <= 1.1x a pull of the same image on a node without its layers, registry 2 ms away", value: p50Ratio(1), max: 1.1}},
		notes: func(r *result) string {
			mu.Lock()
			defer mu.Unlock()
			med := func(s []int64) int64 {
				if len(s) == 0 {
					return 0
				}
				c := slices.Sorted(slices.Values(s))
				return c[len(c)/2]
			}
			b0, b1 := med(bytes[0]), med(bytes[1])
			ratio := 0.0
			if b0 > 0 {
				ratio = float64(b1) / float64(b0)
			}
			return fmt.Sprintf("bytes the registry served per pull (median): %d for the new image, %d for the copy (the proof and the runtime's manifest and config): %.2fx; the private layer is %d bytes before compression; time %.2fx",
				b0, b1, ratio, proofLayerBytes, r.p50Ratio(1))
		},
	}
}

// pullThenRemove makes calls that each pull the next image of pool through
// cc with auth, timed alone, then remove it through rm (untimed: through
// the proxy, it also forgets the record, and the layer words with it, so
// that the next pull of it proves its layers again).
func pullThenRemove(cc, rm *grpc.ClientConn, pool []string, auth *runtimeapi.AuthConfig) timedCall {
	var next atomic.Int64
	c, r := runtimeapi.NewImageServiceClient(cc), runtimeapi.NewImageServiceClient(rm)
	return func(ctx context.Context) (time.Duration, error) {
		if len(pool) == 0 {
			return 0, fmt.Errorf("no images to pull")
		}
		img := pool[int(next.Add(1)-1)%len(pool)]
		start := time.Now()
		_, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}, Auth: auth,
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "b", Namespace: "b", Uid: "bench-b"}}})
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		_, err = r.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: img}})
		return took, err
	}
}

// privateCopies pushes n private images of A's (one random layer of
// proofLayerBytes each), pulls them as A through the ensure proxy, and
// pushes for each a copy of B's own (another config, the same layer) to a
// repository of B's; it returns the copies' references through the relay.
func (e *benchEnv) privateCopies(ee *ensureEnv, n int) ([]string, error) {
	var out []string
	c := runtimeapi.NewImageServiceClient(ee.small)
	for i := range n {
		l, err := random.Layer(proofLayerBytes, types.OCILayer)
		if err != nil {
			return nil, err
		}
		private := fmt.Sprintf("bench-proof/a-%d:v1", i)
		cp := fmt.Sprintf("bench-proof/b-copy-%d:v1", i)
		if err := e.pushWithLayers(private, "A", l); err != nil {
			return nil, err
		}
		if err := e.pushWithLayers(cp, "B", l); err != nil {
			return nil, err
		}
		if _, err := c.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "registry.remote.test/" + private}, Auth: aliceAuth}); err != nil {
			return nil, fmt.Errorf("the private image %s, pulled as A: %w", private, err)
		}
		out = append(out, "registry.remote.test/"+cp)
	}
	return out, nil
}

// freshLargeImages pushes n images of the same shape as the copies (one
// random layer of proofLayerBytes), each its own layer.
func (e *benchEnv) freshLargeImages(n int) ([]string, error) {
	var out []string
	for i := range n {
		l, err := random.Layer(proofLayerBytes, types.OCILayer)
		if err != nil {
			return nil, err
		}
		ref := fmt.Sprintf("bench-proof/fresh-%d:v1", i)
		if err := e.pushWithLayers(ref, "fresh", l); err != nil {
			return nil, err
		}
		out = append(out, "registry.remote.test/"+ref)
	}
	return out, nil
}
