package main

import (
	"context"
	"fmt"
	"slices"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/registry"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// registryCheckScenario measures the content-aware registry check
// (package registry, run in this process, as the daemon would run it)
// against the runtime's re-check pull of a present image it replaces: the
// same image, credential and registry, 2 ms away (the relay of the ensure
// scenarios), both resolving through containerd's hosts.toml.
var registryCheckScenario = scenarioOf("registry check c=1, registry 2 ms away: content-aware check vs the runtime's re-check pull",
	[]part{ensureProxies}, (*benchEnv).registryCheck)

func (e *benchEnv) registryCheck() scenario {
	ee := e.ensure
	creds := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}
	hostsDir := e.rig.HostsDir()
	checker, err := registry.New(registry.Options{HostsDir: hostsDir})
	var (
		mu       sync.Mutex
		imageID  string
		requests []int
	)
	status := runtimeapi.NewImageServiceClient(e.direct)
	// check runs one check with the daemon's long-lived Checker, or, fresh,
	// with a new one: nothing remembered (challenge, tag, manifests,
	// connections), the worst case.
	check := func(ctx context.Context, fresh bool) error {
		if err != nil {
			return err
		}
		c := checker
		if fresh {
			if c, err = registry.New(registry.Options{HostsDir: hostsDir}); err != nil {
				return err
			}
		}
		mu.Lock()
		id := imageID
		mu.Unlock()
		if id == "" {
			st, err := status.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ee.remote}})
			if err != nil {
				return err
			}
			if st.Image == nil {
				return fmt.Errorf("%s is not on the node", ee.remote)
			}
			id = st.Image.Id
			mu.Lock()
			imageID = id
			mu.Unlock()
		}
		res, err := c.Check(ctx, registry.Request{Image: ee.remote, ImageID: id, Blobs: true,
			Credential: registry.Credential{Username: creds.Username, Password: creds.Password}})
		if !fresh {
			mu.Lock()
			requests = append(requests, res.Requests)
			mu.Unlock()
		}
		return err
	}
	return scenario{
		conc: 1,
		arms: []arm{
			{name: "direct PullImage, credentials re-checked", call: pullCall(e.direct, ee.remote, creds), cpu: []string{"containerd"}},
			{name: "content-aware check (package registry): the manifest, then HEAD config and layers", call: func(ctx context.Context) error { return check(ctx, false) }, cpu: []string{"bench"}},
			{name: "the same check by a new Checker each time: nothing remembered", call: func(ctx context.Context) error { return check(ctx, true) }, cpu: []string{"bench"}},
		},
		targets: []target{{desc: "content-aware check p50 <= 1.1x the runtime's re-check pull, registry 2 ms away", value: p50Ratio(1), max: 1.1}},
		notes: func(*result) string {
			mu.Lock()
			defer mu.Unlock()
			if len(requests) == 0 {
				return "no check ran"
			}
			s := slices.Clone(requests)
			slices.Sort(s)
			return fmt.Sprintf("registry requests per content-aware check: %d (median of %d; the first, which learns the registry's challenge, included), in 2 rounds: the manifest (a HEAD once the tag's digest is known, else a GET), then the HEADs of the blobs in parallel; the runtime's re-check makes 2 (HEAD 401, HEAD) in 2 rounds; a new Checker adds a 401 round (and a GET)",
				s[len(s)/2], len(s))
		},
	}
}
