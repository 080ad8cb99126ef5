package ensure_test

import (
	"context"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// BenchmarkGuardImageStatus is the guard's own cost on ImageStatus, with
// the bbolt store: everything it adds to a call, without the call.
func BenchmarkGuardImageStatus(b *testing.B) {
	for _, tc := range []struct {
		name, image string
	}{{"shown (anonymous pull)", public}, {"hidden (pulled with credentials)", private}} {
		b.Run(tc.name, func(b *testing.B) {
			store, err := records.Open(filepath.Join(b.TempDir(), "ensure.db"), records.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			node := newFakeNode()
			node.serve(private, refApp, "alice:a-pw")
			node.serve(public, refTool, "")
			p, _ := ensure.NewPolicy(ensure.NeverVerifyPreloadedImages, nil)
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
