package imagepolicy

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	testclock "k8s.io/utils/clock/testing"
)

// BenchmarkDecideCachedAtCreate is the engine's cost for a container whose
// image was allowed at pull: what a cached decision adds to
// CreateContainer (the target is 5 us of proxy CPU), with metrics on and
// the decision log at info.
func BenchmarkDecideCachedAtCreate(b *testing.B) {
	providers := []Provider{
		testProvider("sigstore-image-policy", []string{"secure", "payments"}, "registry.test:5000", "*.example.com"),
		testProvider("other-namespaces", []string{"elsewhere"}, "registry.test:5000"),
	}
	e, err := New(&Config{Hash: "h", Providers: providers}, Options{
		Clock: testclock.NewFakeClock(time.Unix(1_800_000_000, 0)), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		b.Fatal(err)
	}
	f := &fakeRunner{resp: testAllow}
	for _, p := range e.current().providers {
		p.Runner = f
	}
	ctx := context.Background()
	v, _ := e.Decide(ctx, pull("secure", "registry.test:5000/team/app", digestA))
	e.Bind(v, imageID)
	s := create("secure", "registry.test:5000/team/app", imageID)
	b.ReportAllocs()
	for b.Loop() {
		if v, _ := e.Decide(ctx, s); !v.Allowed {
			b.Fatal("refused")
		}
	}
	if f.calls() != 1 {
		b.Fatalf("the plugin ran %d times", f.calls())
	}
}
