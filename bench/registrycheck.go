package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/e2e/rig"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// registryCheckScenario measures the content-aware registry check of issue
// #28 (package registry, run in this process, as the daemon would run it)
// against the runtime's re-check pull of a present image it replaces: the
// same image, credential and registry, 2 ms away (the relay of the ensure
// scenarios), both resolving through containerd's hosts.toml.
func (e *benchEnv) registryCheckScenario() scenario {
	ee := e.ensure
	creds := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}
	checker, err := registry.New(registry.Options{HostsDir: filepath.Join(filepath.Dir(e.rig.ContainerdSock), "certs.d")})
	var (
		mu       sync.Mutex
		imageID  string
		requests []int
	)
	status := runtimeapi.NewImageServiceClient(e.direct)
	check := func(ctx context.Context) error {
		if err != nil {
			return err
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
		res, err := checker.Check(ctx, registry.Request{Image: ee.remote, ImageID: id, Blobs: true,
			Credential: registry.Credential{Username: creds.Username, Password: creds.Password}})
		mu.Lock()
		requests = append(requests, res.Requests)
		mu.Unlock()
		return err
	}
	return scenario{
		name: "registry check c=1, registry 2 ms away: content-aware check vs the runtime's re-check pull", conc: 1,
		arms: []arm{
			{name: "direct PullImage, credentials re-checked", call: pullCall(e.direct, ee.remote, creds), cpu: []string{"containerd"}},
			{name: "content-aware check: GET manifest, HEAD config and layers (package registry)", call: check, cpu: []string{"bench"}},
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
			return fmt.Sprintf("registry requests per content-aware check: %d (median of %d; the first, which learns the registry's challenge, included), in 2 rounds: GET of the manifest, then the HEADs in parallel; the runtime's re-check makes 2 (HEAD 401, HEAD) in 2 rounds",
				s[len(s)/2], len(s))
		},
	}
}
