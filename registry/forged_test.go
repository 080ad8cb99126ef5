package registry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// syncBuffer is a log's output, written by the check's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAForgedAnswerIsReportedAsForged: a registry that serves, for a
// digest the image names, bytes that are not that content (a tenant's
// registry naming another tenant's image ID or layers) is refused as a
// forgery: ErrForged (and ErrDenied, the refusal it is), a short reason
// for the pod with no digest, the registry, the repository and the
// digests for the operator, and "forged" in the metrics.
func TestAForgedAnswerIsReportedAsForged(t *testing.T) {
	ctx := context.Background()
	l1, l2 := newLayer(t, "a's base layer ", ocispec.MediaTypeImageLayerGzip), newLayer(t, "a's secret file ", ocispec.MediaTypeImageLayerGzip)
	_, aConfigDesc := imageConfigOf(t, "a", l1.diffID, l2.diffID)
	aManifest := ocispec.Manifest{Config: aConfigDesc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}}
	notTheConfig := []byte(`{"rootfs":{"type":"layers","diff_ids":[]}}`)
	bOwn := newLayer(t, "b's own layer ", ocispec.MediaTypeImageLayerGzip)

	for _, tc := range []struct {
		name string
		// serve writes what B's registry serves and returns the request.
		serve func(lr lyingRegistry) Request
		// honest: a registry that answers 404 to a HEAD of what it does
		// not hold, not 200 to every one.
		honest bool
		// noDigestHeader: blob answers name no Docker-Content-Digest.
		noDigestHeader bool
		// reason is what the pod reads; operator, what the operator's log
		// holds beyond the registry and repository.
		reason   string
		operator []string
		// The metrics: blobs counted forged, proofs counted forged.
		forgedBlobs, forgedProofs float64
	}{
		{
			name: "other bytes served under another tenant's config digest are a forged config",
			serve: func(lr lyingRegistry) Request {
				lr.Put("b/app", "blobs", aConfigDesc.Digest.String(), ocispec.MediaTypeImageConfig, notTheConfig)
				return Request{Image: lr.manifest(t, "b/app", "v1", aManifest), Blobs: true}
			},
			reason:      "the registry's bytes are not the image's config",
			operator:    []string{aConfigDesc.Digest.String(), digest.FromBytes(notTheConfig).String()},
			forgedBlobs: 1,
		},
		{
			name: "a forged config with blobs missing besides is a forged config, the missing ones named for the operator",
			serve: func(lr lyingRegistry) Request {
				lr.Put("b/app", "blobs", aConfigDesc.Digest.String(), ocispec.MediaTypeImageConfig, notTheConfig)
				return Request{Image: lr.manifest(t, "b/app", "v2", aManifest), Blobs: true}
			},
			honest:      true, // it answers 404 for A's layers
			reason:      "the registry's bytes are not the image's config",
			operator:    []string{aConfigDesc.Digest.String(), digest.FromBytes(notTheConfig).String(), "not readable either: " + l1.desc.Digest.String() + " missing"},
			forgedBlobs: 1,
		},
		{
			name: "beside the runtime's pull, other bytes under the config digest the runtime holds are a forged config",
			serve: func(lr lyingRegistry) Request {
				lr.Put("b/app", "blobs", aConfigDesc.Digest.String(), ocispec.MediaTypeImageConfig, notTheConfig)
				image := lr.manifest(t, "b/app", "v3", aManifest)
				man, _ := lr.Content("/v2/b/app/manifests/v3")
				return Request{Image: image, Blobs: true, Beside: pullFuncs{pulled: func(context.Context) (PulledImage, error) {
					return PulledImage{ImageID: aConfigDesc.Digest, ManifestDigests: []digest.Digest{digest.FromBytes(man)}}, nil
				}}}
			},
			reason:      "the registry's bytes are not the image's config",
			operator:    []string{aConfigDesc.Digest.String(), digest.FromBytes(notTheConfig).String()},
			forgedBlobs: 1,
		},
		{
			name: "a proven layer whose blob is other bytes is a forged layer",
			serve: func(lr lyingRegistry) Request {
				cfg, desc := imageConfigOf(t, "b", l1.diffID)
				lr.Blob("b/app", cfg)
				lr.Put("b/app", "blobs", l1.desc.Digest.String(), ocispec.MediaTypeImageLayerGzip, bOwn.blob)
				return Request{Image: lr.manifest(t, "b/app", "v4", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l1.desc}}), Blobs: true, ProveLayers: chooseAll}
			},
			// A HEAD naming the bytes' own digest would give the lie away
			// before the proof: a forger leaves it out.
			noDigestHeader: true,
			reason:         "the registry's bytes are not the image's layer",
			operator:       []string{l1.desc.Digest.String(), bOwn.desc.Digest.String()},
			forgedProofs:   1,
		},
		{
			name: "a proven layer whose blob decompresses to another diff_id is a forged layer",
			serve: func(lr lyingRegistry) Request {
				cfg, desc := imageConfigOf(t, "b", l1.diffID)
				lr.Blob("b/app", cfg)
				lr.Blob("b/app", bOwn.blob)
				return Request{Image: lr.manifest(t, "b/app", "v5", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{bOwn.desc}}), Blobs: true, ProveLayers: chooseAll}
			},
			reason:       "the registry's bytes are not the image's layer",
			operator:     []string{l1.diffID.String(), bOwn.diffID.String()},
			forgedProofs: 1,
		},
		{
			name: "a proven layer whose bytes do not decompress as its media type says is a forged layer",
			serve: func(lr lyingRegistry) Request {
				cfg, desc := imageConfigOf(t, "b", l1.diffID)
				lr.Blob("b/app", cfg)
				garbage := []byte("not gzip at all")
				d := lr.Blob("b/app", garbage)
				layer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: d, Size: int64(len(garbage))}
				return Request{Image: lr.manifest(t, "b/app", "v6", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{layer}}), Blobs: true, ProveLayers: chooseAll}
			},
			reason:       "the registry's bytes are not the image's layer",
			operator:     []string{"do not decompress"},
			forgedProofs: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLyingRegistry(t)
			if tc.honest {
				lr = lyingRegistry{testkit.NewRegistry(t)}
			}
			req := tc.serve(lr)
			if tc.noDigestHeader {
				req.Image = strings.Replace(req.Image, lr.Host, withoutBlobDigests(t, lr.Host), 1)
			}
			var logs syncBuffer
			reg := prometheus.NewRegistry()
			c := newTestChecker(t, Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			res, err := c.Check(ctx, req)
			if !errors.Is(err, ErrForged) || !errors.Is(err, ErrDenied) || errors.Is(err, ErrUnreachable) {
				t.Fatalf("got %v, want ErrForged, a kind of ErrDenied", err)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %T, want an *Error", err)
			}
			t.Logf("the pod reads %q; the operator %q", e.Reason, e.Error())
			if e.Reason != tc.reason || strings.Contains(e.Reason, "sha256:") {
				t.Errorf("the pod reads %q, want %q (no digest)", e.Reason, tc.reason)
			}
			for _, want := range append([]string{"forged", "registry " + res.Registry, "repository b/app"}, tc.operator...) {
				if !strings.Contains(e.Error(), want) {
					t.Errorf("the operator reads %q, which does not say %q", e.Error(), want)
				}
				if !strings.Contains(logs.String(), want) {
					t.Errorf("the operator's log %q does not say %q", logs.String(), want)
				}
			}
			if len(res.Proven) != 0 {
				t.Errorf("proven %v on a forgery", res.Proven)
			}
			for _, m := range []struct {
				family, result string
				want           float64
			}{
				{"cri_image_proxy_registry_checks_total", resultForged, 1},
				{"cri_image_proxy_registry_checks_total", resultDenied, 0}, // a forgery is counted apart
				{"cri_image_proxy_registry_blob_checks_total", blobForged, tc.forgedBlobs},
				{"cri_image_proxy_registry_blob_checks_total", blobError, 0},
				{"cri_image_proxy_registry_layer_proofs_total", proofForged, tc.forgedProofs},
			} {
				if n := countOf(t, reg, m.family, m.result); n != m.want {
					t.Errorf("%s{result=%q}: %v, want %v", m.family, m.result, n, m.want)
				}
			}
		})
	}
}

// countOf sums a counter family's series with result.
func countOf(t *testing.T, reg prometheus.Gatherer, family, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// withoutBlobDigests is a registry in front of host that names no
// Docker-Content-Digest for blobs; it returns its host.
func withoutBlobDigests(t *testing.T, host string) string {
	t.Helper()
	p := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: host})
	p.ModifyResponse = func(r *http.Response) error {
		if strings.Contains(r.Request.URL.Path, "/blobs/") {
			r.Header.Del("Docker-Content-Digest")
		}
		return nil
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
