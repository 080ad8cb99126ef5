package registry

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// lyingRegistry is a registry a tenant runs: it answers 200 to every HEAD
// and serves, by GET, only the bytes the test wrote, whatever the
// repository. It checks no credential.
type lyingRegistry struct{ *testkit.Registry }

func newLyingRegistry(t *testing.T) lyingRegistry {
	return lyingRegistry{testkit.NewLyingRegistry(t)}
}

// manifest serves m, an OCI image manifest, under repo:tag (and its
// digest) and returns the reference by tag.
func (lr lyingRegistry) manifest(t *testing.T, repo, tag string, m ocispec.Manifest) string {
	t.Helper()
	m.Versioned.SchemaVersion, m.MediaType = 2, ocispec.MediaTypeImageManifest
	return lr.Manifest(t, repo, tag, ocispec.MediaTypeImageManifest, m)
}

// layerOf is a layer's blob in a media type, and its diff_id.
type testLayer struct {
	tar    []byte
	blob   []byte
	desc   ocispec.Descriptor
	diffID digest.Digest
}

func newLayer(t *testing.T, content string, mediaType string) testLayer {
	t.Helper()
	tar := []byte(strings.Repeat(content, 64)) // the content stands for a tar stream
	var blob []byte
	switch mediaType {
	case ocispec.MediaTypeImageLayerGzip:
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(tar)
		zw.Close()
		blob = buf.Bytes()
	case ocispec.MediaTypeImageLayerZstd:
		zw, _ := zstd.NewWriter(nil)
		blob = zw.EncodeAll(tar, nil)
	default:
		blob = tar
	}
	return testLayer{tar: tar, blob: blob, diffID: digest.FromBytes(tar),
		desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(blob), Size: int64(len(blob))}}
}

// imageConfigOf is a config listing diffIDs; salt makes it B's own bytes.
func imageConfigOf(t *testing.T, salt string, diffIDs ...digest.Digest) ([]byte, ocispec.Descriptor) {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "config": map[string]any{"Env": []string{"SALT=" + salt}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

// chooseAll names every layer for a proof.
func chooseAll(_ context.Context, _ digest.Digest, layers []Layer) ([]digest.Digest, error) {
	var out []digest.Digest
	for _, l := range layers {
		out = append(out, l.DiffID)
	}
	return out, nil
}

func newTestChecker(t *testing.T, o Options) *Checker {
	t.Helper()
	if o.HostsDir == "" {
		o.HostsDir = t.TempDir()
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNoDigestIsAKey: a registry of the caller's own that answers every
// HEAD gains nothing from digests of another tenant's private image (its
// image ID, its manifest, its diff_ids, its layer digests): the config is
// proven by its bytes, and a layer the caller names by diff_id by its
// bytes, decompressed.
func TestNoDigestIsAKey(t *testing.T) {
	ctx := context.Background()
	// A's private image: two layers and a config A's registry alone serves.
	l1, l2 := newLayer(t, "a's base layer ", ocispec.MediaTypeImageLayerGzip), newLayer(t, "a's secret file ", ocispec.MediaTypeImageLayerGzip)
	_, aConfigDesc := imageConfigOf(t, "a", l1.diffID, l2.diffID)
	aManifest := ocispec.Manifest{Config: aConfigDesc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}}
	bOwn := newLayer(t, "b's own layer ", ocispec.MediaTypeImageLayerGzip)

	for _, tc := range []struct {
		name string
		// serve writes what B's registry serves, and returns the image to check.
		serve      func(lr lyingRegistry) string
		prove      LayerChooser
		wantErr    error
		wantReason string
	}{
		{
			name: "a manifest of B's naming A's config digest (A's image ID), with A's layer digests, is refused: B cannot serve the config",
			serve: func(lr lyingRegistry) string {
				return lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: aConfigDesc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}, Annotations: map[string]string{"b": "wrote it"}})
			},
			wantErr: ErrDenied, wantReason: "blobs not readable",
		},
		{
			name: "a manifest of B's naming A's config with made-up layers and a wrong config size is refused",
			serve: func(lr lyingRegistry) string {
				c := aConfigDesc
				c.Size = 12345
				made := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("made up"), Size: 10}
				return lr.manifest(t, "b/app", "v2", ocispec.Manifest{Config: c, Layers: []ocispec.Descriptor{made, made}})
			},
			wantErr: ErrDenied,
		},
		{
			name: "A's exact manifest, rebuilt byte for byte from its digests, is refused: B cannot serve the config",
			serve: func(lr lyingRegistry) string {
				return lr.manifest(t, "b/app", "v3", aManifest)
			},
			wantErr: ErrDenied,
		},
		{
			name: "other bytes served under A's config digest are refused as a forged config",
			serve: func(lr lyingRegistry) string {
				lr.Put("b/app", "blobs", aConfigDesc.Digest.String(), ocispec.MediaTypeImageConfig, []byte(`{"rootfs":{"diff_ids":[]}}`))
				return lr.manifest(t, "b/app", "v4", aManifest)
			},
			wantErr: ErrForged, wantReason: reasonForgedConfig,
		},
		{
			name: "a config of B's own listing A's diff_ids, with made-up layer blobs, is refused when those layers must be proven",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID, l2.diffID)
				lr.Blob("b/app", cfg)
				made1 := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("made up 1"), Size: 10}
				made2 := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("made up 2"), Size: 10}
				return lr.manifest(t, "b/app", "v5", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{made1, made2}})
			},
			prove:   chooseAll,
			wantErr: ErrDenied, wantReason: "not found",
		},
		{
			name: "a config of B's own listing A's diff_ids, with A's layer digests (B has not their bytes), is refused",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID, l2.diffID)
				lr.Blob("b/app", cfg)
				return lr.manifest(t, "b/app", "v6", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}})
			},
			prove:   chooseAll,
			wantErr: ErrDenied,
		},
		{
			name: "a config of B's own listing A's diff_ids, with B's own real layer blobs, is refused: they decompress to other content",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID, l2.diffID)
				lr.Blob("b/app", cfg)
				lr.Blob("b/app", bOwn.blob)
				return lr.manifest(t, "b/app", "v7", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{bOwn.desc, bOwn.desc}})
			},
			prove:   chooseAll,
			wantErr: ErrForged, wantReason: reasonForgedLayer,
		},
		{
			name: "a legitimate copy (B's registry holds A's blobs) is proven by its bytes",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID, l2.diffID)
				lr.Blob("b/copy", cfg)
				lr.Blob("b/copy", l1.blob)
				lr.Blob("b/copy", l2.blob)
				return lr.manifest(t, "b/copy", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}})
			},
			prove: chooseAll,
		},
		{
			name: "B's own config with A's diff_ids passes the registry's word alone when no layer must be proven (the caller decides which)",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID, l2.diffID)
				lr.Blob("b/app", cfg)
				return lr.manifest(t, "b/app", "v8", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}})
			},
		},
		{
			name: "a config that lists fewer layers than its manifest is no answer",
			serve: func(lr lyingRegistry) string {
				cfg, desc := imageConfigOf(t, "b", l1.diffID)
				lr.Blob("b/app", cfg)
				return lr.manifest(t, "b/app", "v9", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l1.desc, l2.desc}})
			},
			wantErr: ErrUnreachable,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLyingRegistry(t)
			image := tc.serve(lr)
			c := newTestChecker(t, Options{})
			res, err := c.Check(ctx, Request{Image: image, Blobs: true, ProveLayers: tc.prove})
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("got %v, want verified", err)
				}
				if tc.prove != nil {
					if len(res.Proven) != 2 || res.ProvenBytes != l1.desc.Size+l2.desc.Size {
						t.Errorf("proven %v (%d bytes), want both layers (%d bytes)", res.Proven, res.ProvenBytes, l1.desc.Size+l2.desc.Size)
					}
				} else if gets := lr.Fetched(); len(gets) != 2 {
					t.Errorf("fetched %v; want the manifest and the config only", gets)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(e.Error(), tc.wantReason) {
				t.Errorf("got %v, want it to say %q", err, tc.wantReason)
			}
			if len(res.Proven) != 0 {
				t.Errorf("proven %v on a refusal", res.Proven)
			}
		})
	}
}

func TestProveLayersReadsEveryFormatTheRuntimeUnpacks(t *testing.T) {
	ctx := context.Background()
	for _, mt := range []string{ocispec.MediaTypeImageLayerGzip, ocispec.MediaTypeImageLayerZstd, ocispec.MediaTypeImageLayer, "application/vnd.docker.image.rootfs.diff.tar.gzip"} {
		t.Run(mt, func(t *testing.T) {
			lr := newLyingRegistry(t)
			l := newLayer(t, "content of "+mt, mt)
			if mt == "application/vnd.docker.image.rootfs.diff.tar.gzip" {
				l = newLayer(t, "content of "+mt, ocispec.MediaTypeImageLayerGzip)
				l.desc.MediaType = mt
			}
			cfg, desc := imageConfigOf(t, mt, l.diffID)
			lr.Blob("b/app", cfg)
			lr.Blob("b/app", l.blob)
			image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l.desc}})
			res, err := newTestChecker(t, Options{}).Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
			if err != nil || len(res.Proven) != 1 || res.Proven[0] != l.diffID {
				t.Fatalf("got %v, proven %v", err, res.Proven)
			}
		})
	}
	t.Run("a non-distributable layer cannot be proven: refused", func(t *testing.T) {
		lr := newLyingRegistry(t)
		l := newLayer(t, "foreign", ocispec.MediaTypeImageLayerGzip)
		l.desc.MediaType = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
		cfg, desc := imageConfigOf(t, "nd", l.diffID)
		lr.Blob("b/app", cfg)
		lr.Blob("b/app", l.blob)
		image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l.desc}})
		_, err := newTestChecker(t, Options{}).Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("got %v, want ErrDenied", err)
		}
	})
	t.Run("a layer over the proof bound is not read to its end, and refuses", func(t *testing.T) {
		lr := newLyingRegistry(t)
		l := newLayer(t, strings.Repeat("x", 4096), ocispec.MediaTypeImageLayer)
		cfg, desc := imageConfigOf(t, "big", l.diffID)
		lr.Blob("b/app", cfg)
		lr.Blob("b/app", l.blob)
		image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l.desc}})
		res, err := newTestChecker(t, Options{MaxProofBytes: 1000}).Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
		if !errors.Is(err, ErrUnreachable) || len(res.Proven) != 0 {
			t.Fatalf("got %v, proven %v; want ErrUnreachable", err, res.Proven)
		}
	})
}

// TestARedirectTargetsChallengeIsNeverTheRegistrys: a blob GET sent on to
// storage that answers 401 with a token realm of its own: the check does
// not authenticate there, and later checks send their credential to the
// registry's own challenge, never the storage's realm.
func TestARedirectTargetsChallengeIsNeverTheRegistrys(t *testing.T) {
	e := newEnv(t, authBasic)
	var storageTokens sync.Map
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			storageTokens.Store(r.Header.Get("Authorization"), true)
			io.WriteString(w, `{"token":"storage-token"}`)
			return
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="storage"`, r.Host))
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(storage.Close)
	// Read by the registry's handlers, which may still serve a request
	// the first check gave up on after it returned.
	var redirect atomic.Bool
	redirect.Store(true)
	e.reg.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if redirect.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && r.Header.Get("Authorization") != "" {
			http.Redirect(w, r, storage.URL+"/blob", http.StatusTemporaryRedirect)
			return true
		}
		return false
	})
	ctx := context.Background()
	_, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("got %v, want ErrUnreachable naming the storage's refusal", err)
	}
	redirect.Store(false)
	e.reg.setHook(nil)
	if _, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}); err != nil {
		t.Fatalf("the next check: %v", err)
	}
	n := 0
	storageTokens.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("the storage's token realm was asked %d times: a credential went to the redirect's realm", n)
	}
	for _, s := range e.reg.requests() {
		if s.status == http.StatusUnauthorized && s.auth == "bearer" {
			t.Errorf("a bearer token went to the registry, which asks for basic: %+v", s)
		}
	}
}

func TestARequestTheRegistryRefusesIsARefusalNotAnOutage(t *testing.T) {
	for _, code := range []int{http.StatusRequestHeaderFieldsTooLarge, http.StatusRequestEntityTooLarge, http.StatusBadRequest} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			e := newEnv(t, authBasic)
			e.reg.setHook(func(w http.ResponseWriter, r *http.Request) bool {
				if len(r.Header.Get("Authorization")) > 64<<10 {
					w.WriteHeader(code)
					return true
				}
				return false
			})
			huge := Credential{Username: "alice", Password: strings.Repeat("p", 1<<20)}
			reg := prometheus.NewRegistry()
			c := e.newChecker(t, Options{Registerer: reg})
			_, err := c.Check(context.Background(), Request{Image: e.image("team-a/app:v1"), Credential: huge, Blobs: true})
			if !errors.Is(err, ErrDenied) || errors.Is(err, ErrUnreachable) {
				t.Fatalf("got %v, want ErrDenied", err)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if mf.GetName() == "cri_image_proxy_registry_checks_total" && l.GetName() == "result" && l.GetValue() == resultUnreachable {
							t.Errorf("a check counted unreachable: a refused request raises the registry-unreachable alert")
						}
					}
				}
			}
		})
	}
}

func TestMetricLabelsStayBoundedWhateverHostsPodsName(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newTestChecker(t, Options{Registerer: reg, Timeout: 2 * 1e9})
	ctx := context.Background()
	// Hosts that answer nothing: each a pod could name.
	for i := 0; i < 3*maxLabelledHosts; i++ {
		c.Check(ctx, Request{Image: fmt.Sprintf("127.0.0.%d:1/x/y:z", 2+i%200), Blobs: true})
	}
	// A registry that answers, after them, still gets its own label.
	lr := newLyingRegistry(t)
	cfg, desc := imageConfigOf(t, "ok")
	lr.Blob("b/app", cfg)
	image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{}})
	if _, err := c.Check(ctx, Request{Image: image, Blobs: true}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "registry" {
					hosts[l.GetValue()] = true
				}
			}
		}
	}
	if len(hosts) > 3 || !hosts[lr.Host] || !hosts[otherHost] {
		t.Errorf("registry labels %v: want the answering registry, %q, and no more", hosts, otherHost)
	}
}

// TestALayerProvenBeforeIsProvenByItsBytesAgain: once a blob was seen to
// decompress to its diff_id, a later proof of it hashes the bytes instead
// of inflating them, and still needs the registry to serve them in the
// repository asked: other bytes under the digest are a forgery, a
// repository without them refuses, and the same digest under another
// media type is decompressed again.
func TestALayerProvenBeforeIsProvenByItsBytesAgain(t *testing.T) {
	ctx := context.Background()
	lr := newLyingRegistry(t)
	host := withoutBlobDigests(t, lr.Host)
	c := newTestChecker(t, Options{})
	l := newLayer(t, "a base layer many images share ", ocispec.MediaTypeImageLayerGzip)
	other := newLayer(t, "not the base layer ", ocispec.MediaTypeImageLayerGzip)
	imageIn := func(repo string, layer ocispec.Descriptor) string {
		cfg, desc := imageConfigOf(t, repo, l.diffID)
		lr.Blob(repo, cfg)
		lr.manifest(t, repo, "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{layer}})
		return host + "/" + repo + ":v1"
	}
	prove := func(image string) (Result, error) {
		return c.Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
	}

	lr.Blob("a/app", l.blob)
	if res, err := prove(imageIn("a/app", l.desc)); err != nil || len(res.Proven) != 1 {
		t.Fatalf("the first proof: %v, proven %v", err, res.Proven)
	}
	if !c.inflations.known(Layer{Blob: l.desc, DiffID: l.diffID}) {
		t.Fatalf("a layer proven by decompression is not remembered")
	}
	t.Run("the same bytes in another repository prove it", func(t *testing.T) {
		lr.Blob("b/app", l.blob)
		if res, err := prove(imageIn("b/app", l.desc)); err != nil || len(res.Proven) != 1 {
			t.Fatalf("got %v, proven %v", err, res.Proven)
		}
	})
	t.Run("other bytes under its digest are a forged layer", func(t *testing.T) {
		lr.Put("c/app", "blobs", l.desc.Digest.String(), ocispec.MediaTypeImageLayerGzip, other.blob)
		res, err := prove(imageIn("c/app", l.desc))
		if !errors.Is(err, ErrForged) || len(res.Proven) != 0 {
			t.Fatalf("got %v, proven %v; want ErrForged", err, res.Proven)
		}
	})
	t.Run("a repository that does not serve it cannot prove it", func(t *testing.T) {
		res, err := prove(imageIn("d/app", l.desc))
		if err == nil || len(res.Proven) != 0 {
			t.Fatalf("got %v, proven %v; want a refusal", err, res.Proven)
		}
	})
	t.Run("the same digest named with another media type is decompressed again: a forged layer", func(t *testing.T) {
		lr.Blob("e/app", l.blob)
		zstdDesc := l.desc
		zstdDesc.MediaType = ocispec.MediaTypeImageLayerZstd
		res, err := prove(imageIn("e/app", zstdDesc))
		if !errors.Is(err, ErrForged) || len(res.Proven) != 0 {
			t.Fatalf("got %v, proven %v; want ErrForged", err, res.Proven)
		}
	})
}
