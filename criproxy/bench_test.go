package criproxy

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// These in-process benchmarks put client, proxy and fake runtime in one
// process; they are for profiling the proxy's code. The figures that
// matter, against real containerd and a floor, come from `make bench`.

func BenchmarkPassThroughImageStatus(b *testing.B) {
	rig := newProxyRig(b, Options{}, false)
	rig.runtime.Put(fakecri.Image("sha256:runtime", "registry.example/team-a/app:v1"))
	req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "registry.example/team-a/app:v1"}}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := rig.img.ImageStatus(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDirectImageStatus(b *testing.B) {
	rig := newProxyRig(b, Options{}, false)
	rig.runtime.Put(fakecri.Image("sha256:runtime", "registry.example/team-a/app:v1"))
	req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "registry.example/team-a/app:v1"}}
	ctx := context.Background()
	conn := runtimeapi.NewImageServiceClient(rig.directConn)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := conn.ImageStatus(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
