package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The realistic rows of the ensure checks: images of the size pods run
// (realisticLayers random layers of realisticLayerBytes, as the image
// policy's far pulls), from the authenticated registry farDelay away each
// way (farAuthRegistry: a relay that delays without capping bandwidth). A
// present image's pull with credentials, and a copy's pull proving its
// private layers; the new image's and the new signed image's are the image
// policy's far scenario (imagepolicy.go).
const farAuthRegistry = "registry.far.test"

// farEnv is what the realistic rows pull.
type farEnv struct {
	relay *rig.DelayRelay
	// present is A's private image, pulled with A's credential through the
	// ensure-100 proxy: on the node, and recorded.
	present string
	// copies are B's copies of A's private images (B's config, A's
	// layers), whose originals A pulled through the ensure-100 proxy; fresh
	// are images of the same shape, each of layers of its own.
	copies, fresh []string
}

// farCopies is how many private images and copies the proof rows rotate
// through; farFresh how many images of that shape the direct arm does.
const farCopies, farFresh = 2, 6

func (e *benchEnv) setUpFar() error {
	relay, err := rig.StartLatencyRelay(e.rig.Registry, farDelay)
	if err != nil {
		return err
	}
	if err := e.rig.AddMirror(farAuthRegistry, relay.Port()); err != nil {
		return err
	}
	fe := &farEnv{relay: relay}
	e.far = fe
	e.logf("pushing the realistic rows' images (%d MiB in %d layers each)", realisticLayers*realisticLayerBytes>>20, realisticLayers)
	if _, err := e.rig.PushRealistic("bench-far-private/app:v1", "far private", realisticLayers, realisticLayerBytes); err != nil {
		return err
	}
	fe.present = farAuthRegistry + "/bench-far-private/app:v1"
	c := runtimeapi.NewImageServiceClient(e.ensure.small)
	ctx := context.Background()
	if _, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: fe.present}, Auth: aliceAuth}); err != nil {
		return fmt.Errorf("pull %s as A: %w", fe.present, err)
	}
	for i := range farCopies {
		layers, err := randomLayers(realisticLayers, realisticLayerBytes)
		if err != nil {
			return err
		}
		private, cp := fmt.Sprintf("bench-far-proof/a-%d:v1", i), fmt.Sprintf("bench-far-proof/b-copy-%d:v1", i)
		if err := e.pushWithLayers(private, "A", layers...); err != nil {
			return err
		}
		if err := e.pushWithLayers(cp, "B", layers...); err != nil {
			return err
		}
		if _, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: farAuthRegistry + "/" + private}, Auth: aliceAuth}); err != nil {
			return fmt.Errorf("the private image %s, pulled as A: %w", private, err)
		}
		fe.copies = append(fe.copies, farAuthRegistry+"/"+cp)
	}
	for i := range farFresh {
		layers, err := randomLayers(realisticLayers, realisticLayerBytes)
		if err != nil {
			return err
		}
		ref := fmt.Sprintf("bench-far-proof/fresh-%d:v1", i)
		if err := e.pushWithLayers(ref, "fresh", layers...); err != nil {
			return err
		}
		fe.fresh = append(fe.fresh, farAuthRegistry+"/"+ref)
	}
	return nil
}

func randomLayers(n int, size int64) ([]v1.Layer, error) {
	var out []v1.Layer
	for range n {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// pushWithLayers pushes an image of layers whose config names owner.
func (e *benchEnv) pushWithLayers(ref, owner string, layers ...v1.Layer) error {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"OWNER=" + owner}, Cmd: []string{"sh"}})
	if err != nil {
		return err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	tag, err := name.NewTag(e.rig.Registry+"/"+ref, name.Insecure)
	if err != nil {
		return err
	}
	return remote.Write(tag, img, remote.WithAuth(&authn.Basic{Username: "user", Password: rig.Users["user"]}))
}

var realisticSize = fmt.Sprintf("%d MiB in %d layers, registry %s away", realisticLayers*realisticLayerBytes>>20, realisticLayers, 2*farDelay)

// realisticScenarios are the realistic rows of the ensure checks.
func realisticScenarios() []measurement {
	needs := []part{ensureProxies, farRegistryPart}
	return []measurement{
		scenarioOf("ensure: PullImage(present) c=1 with credentials, a realistic image ("+realisticSize+"): the runtime's re-check vs the registry check answering from the node", needs, func(e *benchEnv) scenario {
			fe := e.far
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage, credentials re-checked by the runtime", call: pullCall(e.direct, fe.present, aliceAuth), cpu: []string{"containerd"}},
					{name: "ensure: the registry check, answered from the node", call: pullCall(e.ensure.small, fe.present, aliceAuth), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{{desc: "a pull of a present realistic image through the registry check p50 <= 1.1x the runtime's re-check, registry 20 ms away", value: p50Ratio(1), max: 1.1}},
			}
		}),
		scenarioOf("ensure: PullImage c=1 of a copy of a realistic private image ("+realisticSize+"): a new image's pull straight to containerd vs the copy's pull proving its private layers", needs, func(e *benchEnv) scenario {
			fe := e.far
			bob := &runtimeapi.AuthConfig{Username: "bob", Password: rig.Users["bob"]}
			return scenario{
				conc: 1,
				long: true,
				arms: []arm{
					{name: "direct PullImage of a new image (its layers fetched and unpacked)", call: timed(pullThenRemove(e.direct, e.direct, fe.fresh, aliceAuth)), cpu: []string{"containerd"}},
					{name: "ensure: PullImage of a copy of a private image on the node (its private layers proven by their bytes)", call: timed(pullThenRemove(e.ensure.small, e.ensure.small, fe.copies, bob)), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{{desc: "a copy's pull proving its realistic private layers p50 <= 1.1x a pull of the same shape on a node without its layers, registry 20 ms away", value: p50Ratio(1), max: 1.1}},
				notes: func(r *result) string {
					return fmt.Sprintf("the copy's proof against a new image's pull: %+v (p50), %.2fx", r.p50Delta(1).Round(time.Millisecond), r.p50Ratio(1))
				},
			}
		}),
	}
}
