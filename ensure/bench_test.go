package ensure_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
)

// BenchmarkGuardImageStatus is the guard's own cost on ImageStatus, with
// the bbolt store: everything it adds to a call, without the call. The
// preloaded tag is the private image's digest, preloaded as another tag of
// its repository before the private pull: decided (its repository is
// restricted), shown from the preloaded names in memory.
func BenchmarkGuardImageStatus(b *testing.B) {
	for _, tc := range []struct {
		name, image string
	}{{"shown (anonymous pull)", public}, {"hidden (pulled with credentials)", private}, {"shown (a preloaded tag of a repository pulled with credentials)", preloadedTag}} {
		b.Run(tc.name, func(b *testing.B) {
			store, err := records.Open(filepath.Join(b.TempDir(), "ensure.db"), records.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			node := newFakeNode()
			node.serve(private, refApp, "alice:a-pw")
			node.serve(public, refTool, "")
			node.preload(preloadedTag, refApp)
			p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
			g, err := ensure.NewGuard(store, p, ensure.CRIRuntime(node, node), ensure.GuardOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for img, auth := range map[string]*runtimeapi.AuthConfig{private: cred("alice:a-pw"), public: nil} {
				if _, err := g.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}, Auth: auth}, node.PullImage); err != nil {
					b.Fatal(err)
				}
			}
			req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: tc.image}}
			resp, _ := node.ImageStatus(ctx, req)
			next := func(context.Context, *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
				return resp, nil
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.ImageStatus(ctx, req, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGuardCreateContainer is the guard's own cost on a
// CreateContainer of a public image (the runtime's answers from memory):
// ensure alone, then ensure with an image policy whose verdict, bound at
// the pull, is cached (the target: at most 5 us of proxy CPU more), and the
// image policy's own hooks with ensure off. The plugin runs once, at the
// pull.
func BenchmarkGuardCreateContainer(b *testing.B) {
	engine := benchPolicyEngine(b)
	for _, tc := range []struct {
		name   string
		policy cri.Policy
		hooks  bool
	}{
		{"ensure alone", nil, false},
		{"ensure and an image policy, verdict cached", engine, false},
		{"image policy alone (ensure off), verdict cached", engine, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			node := newFakeNode()
			node.serve(signedImage, refSigned, "")
			p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
			opts := ensure.GuardOptions{Registry: node}
			if tc.policy != nil {
				opts.ImagePolicy = cri.NewGate(tc.policy, nil, nil)
			}
			g, err := ensure.NewGuard(ensuretest.NewMemoryStore(), p, ensure.CRIRuntime(node, node), opts)
			if err != nil {
				b.Fatal(err)
			}
			hooks := cri.NewHooks(engine, nil, node, crireq.RuntimeImages(node), nil)
			ctx := context.Background()
			pull := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: signedImage}, SandboxConfig: podSecure.sandbox()}
			var create func(context.Context, *runtimeapi.CreateContainerRequest, criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error)
			if tc.hooks {
				_, err = hooks.PullImage(ctx, pull, func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					return node.PullImage(ctx, r)
				})
				create = hooks.CreateContainer
			} else {
				_, err = g.PullImage(ctx, pull, node.PullImage)
				create = g.CreateContainer
			}
			if err != nil {
				b.Fatal(err)
			}
			req := &runtimeapi.CreateContainerRequest{PodSandboxId: "sandbox-s1", SandboxConfig: podSecure.sandbox(),
				Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refSigned, UserSpecifiedImage: signedImage}}}
			resp := &runtimeapi.CreateContainerResponse{ContainerId: "c"}
			next := func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				return resp, nil
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := create(ctx, req, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchPolicyEngine is an engine whose one provider, a shell script that
// allows everything, applies to namespace secure.
func benchPolicyEngine(b *testing.B) *imagepolicy.Engine {
	b.Helper()
	dir := b.TempDir()
	plugin := "#!/bin/sh\ncat >/dev/null\n" +
		`echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}'` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "allow-all"), []byte(plugin), 0o755); err != nil {
		b.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfgFile, []byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n"+
		"  - {name: allow-all, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [registry.test], namespaces: [secure]}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err := imagepolicy.LoadConfig(cfgFile, dir)
	if err != nil {
		b.Fatal(err)
	}
	e, err := imagepolicy.New(cfg, imagepolicy.Options{Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		b.Fatal(err)
	}
	return e
}
