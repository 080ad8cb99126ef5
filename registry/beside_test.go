package registry

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestACheckBesideTheRuntimesPull: with the runtime pulling at the same
// time, the check asks the registry's word by HEAD, and takes the
// runtime's fetch of the manifest for its bytes where it is the manifest
// the registry names: no manifest GET beyond the runtime's own.
func TestACheckBesideTheRuntimesPull(t *testing.T) {
	e := newEnv(t, authBasic)
	ctx := context.Background()
	pulled := func(id, manifest digest.Digest) func(context.Context) (PulledImage, error) {
		return func(context.Context) (PulledImage, error) {
			return PulledImage{ImageID: id, ManifestDigests: []digest.Digest{manifest}}, nil
		}
	}
	for _, tc := range []struct {
		name        string
		req         func() Request
		hook        func(w http.ResponseWriter, r *http.Request) bool
		want        error
		manifestGet int
	}{
		{
			name: "the runtime's manifest is the registry's: a HEAD, the config's bytes, no manifest GET",
			req: func() Request {
				return Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true, Beside: pullFuncs{pulled: pulled(e.imgID, e.imgMan)}}
			},
		},
		{
			name: "an index: the runtime records the index's digest, the platform's config is its image",
			req: func() Request {
				return Request{Image: e.image("team-a/multi:v1"), Credential: alice(), Blobs: true, Beside: pullFuncs{pulled: pulled(e.imgID, e.indexDig)}}
			},
		},
		{
			name: "the runtime holds another manifest than the registry names (a tag moved, a mirror's): moved",
			req: func() Request {
				return Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true, Beside: pullFuncs{pulled: pulled(e.otherID, digest.FromString("elsewhere"))}}
			},
			want: ErrMoved,
		},
		{
			name: "a HEAD that names no digest: the registry's word is had by a GET",
			req: func() Request {
				return Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true, Beside: pullFuncs{pulled: pulled(e.imgID, e.imgMan)}}
			},
			hook: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/") && r.Header.Get("Authorization") != "" {
					w.WriteHeader(http.StatusOK)
					return true
				}
				return false
			},
			manifestGet: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.reg.setHook(tc.hook)
			defer e.reg.setHook(nil)
			res, err := e.newChecker(t, Options{}).Check(ctx, tc.req())
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if res.ManifestGets != tc.manifestGet {
				t.Errorf("%d manifest GETs, want %d: %+v", res.ManifestGets, tc.manifestGet, e.reg.requests())
			}
			if tc.want == nil && (len(res.Layers) == 0 || res.ConfigDigest != e.imgID) {
				t.Errorf("layers %v, config %s: want the config's layers and the runtime's image", res.Layers, res.ConfigDigest)
			}
		})
	}

	t.Run("a refusal by HEAD ends the check before it waits for the runtime", func(t *testing.T) {
		waited := false
		_, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app:v1"), Credential: bob(), Blobs: true,
			Beside: pullFuncs{pulled: func(context.Context) (PulledImage, error) { waited = true; return PulledImage{}, nil }}})
		if !errors.Is(err, ErrDenied) || waited {
			t.Fatalf("got %v (waited for the runtime: %v), want ErrDenied at once", err, waited)
		}
	})
	t.Run("Resolved is told the registry's digest before the wait, and its refusal ends the check", func(t *testing.T) {
		var told digest.Digest
		refused := errors.New("refused by the image policy")
		_, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true,
			Beside: pullFuncs{resolved: func(_ context.Context, d digest.Digest) error { told = d; return refused },
				pulled: func(context.Context) (PulledImage, error) {
					t.Error("waited for the runtime")
					return PulledImage{}, nil
				}}})
		if !errors.Is(err, refused) || told != e.imgMan {
			t.Fatalf("got %v, told %s; want the hook's refusal, told %s", err, told, e.imgMan)
		}
	})
	t.Run("a check that ends first ends its early question with it: nothing of it runs on after", func(t *testing.T) {
		ended := make(chan struct{})
		_, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true,
			Beside: pullFuncs{
				// The store is waited on until the check gives up on it.
				manifest: func(ctx context.Context, _ digest.Digest) ([]byte, error) {
					defer close(ended)
					<-ctx.Done()
					return nil, ctx.Err()
				},
				pulled: func(context.Context) (PulledImage, error) {
					return PulledImage{}, errors.New("the runtime's pull failed")
				},
			}})
		if err == nil {
			t.Fatal("a check whose runtime pull failed passed")
		}
		select {
		case <-ended:
		default:
			t.Fatal("the check returned while its early question still ran (it may still count into the result)")
		}
	})
	t.Run("the runtime's store has the manifest: the config's bytes are asked while the runtime still pulls", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			image    string
			recorded digest.Digest
		}{
			{"a manifest", "team-a/app:v1", e.imgMan},
			{"an index, then the platform's manifest", "team-a/multi:v1", e.indexDig},
		} {
			t.Run(tc.name, func(t *testing.T) {
				stored := map[digest.Digest][]byte{}
				for _, m := range []interface{ RawManifest() ([]byte, error) }{e.img, e.index} {
					b, err := m.RawManifest()
					if err != nil {
						t.Fatal(err)
					}
					stored[digest.FromBytes(b)] = b
				}
				asked := make(chan struct{})
				var once sync.Once
				e.reg.setHook(func(_ http.ResponseWriter, r *http.Request) bool {
					if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+e.imgID.String()) {
						once.Do(func() { close(asked) })
					}
					return false
				})
				defer e.reg.setHook(nil)
				before := false
				res, err := e.newChecker(t, Options{}).Check(ctx, Request{Image: e.image(tc.image), Credential: alice(), Blobs: true,
					Beside: pullFuncs{manifest: func(_ context.Context, d digest.Digest) ([]byte, error) {
						if b, ok := stored[d]; ok {
							return b, nil
						}
						return nil, errors.New("not in the store")
					},
						pulled: func(ctx context.Context) (PulledImage, error) {
							// The runtime's pull ends only once the config was asked
							// (bounded: without the early ask it never is).
							select {
							case <-asked:
								before = true
							case <-time.After(10 * time.Second):
							}
							return PulledImage{ImageID: e.imgID, ManifestDigests: []digest.Digest{tc.recorded}}, nil
						}}})
				if err != nil || !before || res.ConfigDigest != e.imgID || len(res.Layers) == 0 {
					t.Fatalf("got %v, config %s, asked before the pull ended: %v; want the config asked beside the pull", err, res.ConfigDigest, before)
				}
			})
		}
		t.Run("a manifest the runtime's store does not have: the config is asked after the pull, as without it", func(t *testing.T) {
			res, err := e.newChecker(t, Options{}).Check(ctx, Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true,
				Beside: pullFuncs{manifest: func(context.Context, digest.Digest) ([]byte, error) { return nil, errors.New("not in the store") },
					pulled: pulled(e.imgID, e.imgMan)}})
			if err != nil || res.ConfigDigest != e.imgID {
				t.Fatalf("got %v, config %s", err, res.ConfigDigest)
			}
		})
		t.Run("bytes that are not the manifest the registry named are not taken", func(t *testing.T) {
			b, _ := e.other.RawManifest()
			res, err := e.newChecker(t, Options{}).Check(ctx, Request{Image: e.image("team-a/app:v1"), Credential: alice(), Blobs: true,
				Beside: pullFuncs{manifest: func(context.Context, digest.Digest) ([]byte, error) { return b, nil },
					pulled: pulled(e.imgID, e.imgMan)}})
			if err != nil || res.ConfigDigest != e.imgID {
				t.Fatalf("got %v, config %s; want the runtime's config checked as without the early ask", err, res.ConfigDigest)
			}
		})
	})
	t.Run("a layer to prove: the manifest is fetched for its blobs, then the layer proven", func(t *testing.T) {
		lr := newLyingRegistry(t)
		l := newLayer(t, "beside", ocispec.MediaTypeImageLayerGzip)
		cfg, desc := imageConfigOf(t, "beside", l.diffID)
		lr.Blob("b/app", cfg)
		lr.Blob("b/app", l.blob)
		image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{l.desc}})
		manifest, _ := lr.Content("/v2/b/app/manifests/v1")
		man := digest.FromBytes(manifest)
		res, err := newTestChecker(t, Options{}).Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll,
			Beside: pullFuncs{pulled: func(context.Context) (PulledImage, error) {
				return PulledImage{ImageID: desc.Digest, ManifestDigests: []digest.Digest{man}}, nil
			}}})
		if err != nil || len(res.Proven) != 1 || res.ManifestGets != 1 {
			t.Fatalf("got %v, proven %v, %d manifest GETs; want the layer proven after one manifest GET", err, res.Proven, res.ManifestGets)
		}
	})
}

// pullFuncs is the runtime's pull as a test writes it (RuntimePull): a nil
// resolved allows every digest, a nil manifest is a store that cannot be
// read.
type pullFuncs struct {
	resolved func(ctx context.Context, manifest digest.Digest) error
	manifest func(ctx context.Context, d digest.Digest) ([]byte, error)
	pulled   func(ctx context.Context) (PulledImage, error)
}

func (p pullFuncs) Resolved(ctx context.Context, manifest digest.Digest) error {
	if p.resolved == nil {
		return nil
	}
	return p.resolved(ctx, manifest)
}

func (p pullFuncs) Manifest(ctx context.Context, d digest.Digest) ([]byte, error) {
	if p.manifest == nil {
		return nil, errors.New("the runtime's store cannot be read")
	}
	return p.manifest(ctx, d)
}

func (p pullFuncs) Pulled(ctx context.Context) (PulledImage, error) { return p.pulled(ctx) }
