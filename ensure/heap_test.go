package ensure_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestHostileNamesLeaveTheGuardsHeapWhereItWas: 1,000 ImageStatus calls
// with distinct 1 MiB names leave the live heap within a few MiB of where
// it started. Through the guard's filter, as the daemon runs them,
// none reaches the guard: no reference is that long, and the filter
// forwards them untouched. The guard itself, given them anyway with a
// runtime answering each as an image of the node, remembers nothing of
// them either (a name with no repository is never hidden: CreateContainer
// decides by the image ID). Not parallel: the heap is the process's.
func TestHostileNamesLeaveTheGuardsHeapWhereItWas(t *testing.T) {
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.start(podA, private, "IfNotPresent") // a record: hiding has work to do
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	present := func(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
		name := req.GetImage().GetImage()
		return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: refApp, RepoTags: []string{name}}}, nil
	}
	start := heap()
	big := strings.Repeat("a", 1<<20)
	filtered := 0
	for i := range 1000 {
		req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: fmt.Sprintf("registry.test/%d/%s:v1", i, big)}}
		if s.guard.WantsImageStatus(req) {
			filtered++
		}
		if _, err := s.guard.ImageStatus(ctx, req, present); err != nil {
			t.Fatal(err)
		}
	}
	if filtered != 0 {
		t.Errorf("the filter handed %d of the names to the guard; want none", filtered)
	}
	if grown := int64(heap()) - int64(start); grown > 8<<20 {
		t.Errorf("the live heap grew by %d MiB; want a few at most", grown>>20)
	}
}
