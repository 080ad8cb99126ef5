package registry

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkCheck compares a content-aware check with the shape of the
// runtime's re-check pull of a present image (HEAD the manifest, 401, HEAD
// again with the credential), against an in-process registry with basic
// auth that answers each request 2 ms late (a registry one hop away).
// requests/op is the HTTP requests per verification.
func BenchmarkCheck(b *testing.B) {
	e := newEnv(b, authBasic)
	e.reg.setHook(func(http.ResponseWriter, *http.Request) bool {
		time.Sleep(2 * time.Millisecond)
		return false
	})
	ctx := context.Background()
	image := e.image("team-a/app:v1")

	b.Run("content-aware check, challenge remembered, blobs", func(b *testing.B) {
		req := Request{Image: image, ImageID: string(e.imgID), Credential: alice(), Blobs: true}
		if _, err := e.checker.Check(ctx, req); err != nil { // learns the challenge
			b.Fatal(err)
		}
		requests := 0
		b.ResetTimer()
		for b.Loop() {
			res, err := e.checker.Check(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			requests += res.Requests
		}
		b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
	})
	b.Run("content-aware check, first check of a new Checker, blobs", func(b *testing.B) {
		req := Request{Image: image, ImageID: string(e.imgID), Credential: alice(), Blobs: true}
		requests := 0
		for b.Loop() {
			b.StopTimer()
			c := e.newChecker(b, Options{Registerer: noRegisterer{}})
			b.StartTimer()
			res, err := c.Check(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			requests += res.Requests
		}
		b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
	})
	b.Run("the runtime's re-check shape: HEAD 401, HEAD", func(b *testing.B) {
		u := "http://" + e.reg.host + "/v2/team-a/app/manifests/v1"
		requests := 0
		for b.Loop() {
			for _, withAuth := range []bool{false, true} {
				req, _ := http.NewRequestWithContext(ctx, http.MethodHead, u, nil)
				req.Header.Set("Accept", acceptManifests)
				if withAuth {
					req.SetBasicAuth("alice", testUsers["alice"])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				requests++
				if withAuth && resp.StatusCode != http.StatusOK {
					b.Fatalf("HEAD: %d", resp.StatusCode)
				}
			}
		}
		b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
	})
}

// noRegisterer takes metrics and keeps none: a new Checker per iteration.
type noRegisterer struct{}

func (noRegisterer) Register(prometheus.Collector) error  { return nil }
func (noRegisterer) MustRegister(...prometheus.Collector) {}
func (noRegisterer) Unregister(prometheus.Collector) bool { return true }
