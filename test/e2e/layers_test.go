package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// startTenantRegistry starts a registry a tenant runs for itself, on
// loopback: it answers 200 to every HEAD, whatever it holds, and serves by
// GET only what the test wrote (testkit.NewLyingRegistry). It checks no
// credential. containerd reaches it through a hosts.toml of its own
// (plain HTTP).
func startTenantRegistry(t *testing.T) *testkit.Registry {
	t.Helper()
	tr := testkit.NewLyingRegistry(t)
	if err := testRig.AddMirror(tr.Host, portOf(t, tr.Host)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testRig.RemoveMirror(tr.Host) })
	return tr
}

// leakedImage is A's private image as its registry holds it: the
// manifest, the config and the layers, raw.
type leakedImage struct {
	ref, id   string
	manifest  []byte
	mediaType string
	config    []byte
	cfg       *v1.ConfigFile
	layers    [][]byte // compressed, in order
	descs     []v1.Descriptor
}

func readLeakedImage(t *testing.T, ref string) leakedImage {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r, remote.WithAuth(&authn.Basic{Username: "user", Password: rig.Users["user"]}))
	if err != nil {
		t.Fatal(err)
	}
	p := leakedImage{ref: ref}
	if p.manifest, err = img.RawManifest(); err != nil {
		t.Fatal(err)
	}
	mt, _ := img.MediaType()
	p.mediaType = string(mt)
	if p.config, err = img.RawConfigFile(); err != nil {
		t.Fatal(err)
	}
	if p.cfg, err = img.ConfigFile(); err != nil {
		t.Fatal(err)
	}
	id, _ := img.ConfigName()
	p.id = id.String()
	m, _ := img.Manifest()
	p.descs = m.Layers
	ls, _ := img.Layers()
	for _, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		p.layers = append(p.layers, b)
	}
	return p
}

// ociManifest is a manifest as B writes it.
type ociManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        v1.Descriptor     `json:"config"`
	Layers        []v1.Descriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

const ociManifestType = "application/vnd.oci.image.manifest.v1+json"

// ownConfig is a config of B's own (its own bytes, its own image ID, one
// per salt) whose diff_ids are A's layers.
func ownConfig(t *testing.T, a leakedImage, salt string) ([]byte, v1.Descriptor) {
	t.Helper()
	cfg := a.cfg.DeepCopy()
	cfg.Config.Env = append(cfg.Config.Env, "WRITTEN_BY=b-"+salt)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, _, _ := v1.SHA256(bytes.NewReader(b))
	return b, v1.Descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: h, Size: int64(len(b))}
}

func madeUpLayers(n int) []v1.Descriptor {
	out := make([]v1.Descriptor, n)
	for i := range out {
		b := make([]byte, 32)
		rand.Read(b)
		h, _, _ := v1.SHA256(bytes.NewReader(b))
		out[i] = v1.Descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: h, Size: 1234}
	}
	return out
}

// TestNoDigestIsAKey: a tenant with a registry of its own, who learnt the
// digests of another tenant's private image (its image ID, manifest,
// diff_ids, layer digests), runs none of its content, whatever its
// registry serves under its own name. Each way is shown first straight to
// the runtime (the control: B's container reads A's file), then through
// the proxy: B's pull refused, B's container refused by every name, C's too.
// A copy of B's own (A's blobs pushed to B's registry) works once its
// bytes are proven, and is re-used without fetching again.
//
// On CRI-O the controls differ: CRI-O fetches an image's config from the
// registry whatever the node holds, so the families naming A's config
// (1, 2) fail at B's registry, which cannot serve it; and it checks a
// layer it downloads against the config's diff_id, so made-up or B's own
// blobs under A's diff_ids (3) fail too. Those controls show CRI-O's own
// failure, and through the proxy B's pull fails as straight to CRI-O or
// is refused. But CRI-O reuses a layer it holds by its blob digest without
// asking the registry: B's own config with A's diff_ids and A's layer
// descriptors gives B's container A's file straight to CRI-O, and that
// one is refused through the proxy as on containerd.
func TestNoDigestIsAKey(t *testing.T) {
	needRig(t)
	const marker = "A's private file (no digest is a key)"
	repoA := "layers-a/app"
	if _, err := testRig.PushBusybox(repoA+":v1", marker); err != nil {
		t.Fatal(err)
	}
	imgA := privateRegistryName() + "/" + repoA + ":v1"
	a := readLeakedImage(t, testRig.Registry+"/"+repoA+":v1")
	alice := newTenant(t, "nd-alice", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "nd-bob", "")
	carol := newTenant(t, "nd-carol", "")
	p := startEnsureProxy(t, "no-digest-key")
	pullA := func(t *testing.T) {
		t.Helper()
		if r := alice.pull(t, p.ep, imgA); r.Err != nil {
			t.Fatalf("A's pull: %v\n%s", r.Err, r.Stderr)
		}
		if got := imageID(t, imgA); !sameImage(got, a.id) {
			t.Fatalf("A's image is %s, want %s", got, a.id)
		}
	}
	pullA(t)
	// A's image ID as the runtime writes it (CRI-O: bare hex), to name it
	// by in its calls, and as neither form may name it to B.
	idA, hexA := imageID(t, imgA), strings.TrimPrefix(a.id, "sha256:")
	t.Cleanup(func() { crictl(t, direct(), "rmi", idA) })

	b := startTenantRegistry(t)
	// B's own configs, one per way of serving the layers: each its own image.
	ownDesc := map[string]v1.Descriptor{}
	for _, repo := range []string{"b/own-made-up", "b/own-a-digests", "b/own-blobs"} {
		cfg, desc := ownConfig(t, a, repo)
		b.Blob(repo, cfg)
		ownDesc[repo] = desc
	}
	bOwnLayers := func() []v1.Descriptor {
		// Real layers of B's own, served: they decompress to other content.
		img, err := random.Image(256, int64(len(a.descs)))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := img.Manifest()
		ls, _ := img.Layers()
		for _, l := range ls {
			rc, _ := l.Compressed()
			bs, _ := io.ReadAll(rc)
			rc.Close()
			b.Blob("b/own-blobs", bs)
		}
		return m.Layers
	}()
	annotated := ociManifest{SchemaVersion: 2, MediaType: ociManifestType, Annotations: map[string]string{"written-by": "b"}}
	families := []struct {
		name   string
		image  string
		sameID bool // the runtime names A's image ID under B's name
		crio   bool // it works straight to CRI-O too
	}{
		{"1. a manifest of B's naming A's config (A's image ID) and A's layer digests", b.Manifest(t, "b/a-config", "v1", ociManifestType,
			func() ociManifest { m := annotated; m.Config = configDesc(a); m.Layers = a.descs; return m }()), true, false},
		{"1. a manifest of B's naming A's config, with made-up layer digests", b.Manifest(t, "b/a-config-made-up", "v1", ociManifestType,
			func() ociManifest {
				m := annotated
				m.Config = configDesc(a)
				m.Layers = madeUpLayers(len(a.descs))
				return m
			}()), true, false},
		{"1. a manifest of B's naming A's config with a wrong size", b.Manifest(t, "b/a-config-size", "v1", ociManifestType,
			func() ociManifest {
				m := annotated
				m.Config = configDesc(a)
				m.Config.Size += 17
				m.Layers = a.descs
				return m
			}()), true, false},
		{"2. A's exact manifest, rebuilt byte for byte", b.Manifest(t, "b/a-exact", "v1", a.mediaType, a.manifest), true, false},
		{"3. a config of B's own with A's diff_ids, and made-up layer blobs", b.Manifest(t, "b/own-made-up", "v1", ociManifestType,
			ociManifest{SchemaVersion: 2, MediaType: ociManifestType, Config: ownDesc["b/own-made-up"], Layers: madeUpLayers(len(a.descs))}), false, false},
		{"3. a config of B's own with A's diff_ids, and A's layer digests", b.Manifest(t, "b/own-a-digests", "v1", ociManifestType,
			ociManifest{SchemaVersion: 2, MediaType: ociManifestType, Config: ownDesc["b/own-a-digests"], Layers: a.descs}), false, true},
		{"3. a config of B's own with A's diff_ids, and B's own real layer blobs", b.Manifest(t, "b/own-blobs", "v1", ociManifestType,
			ociManifest{SchemaVersion: 2, MediaType: ociManifestType, Config: ownDesc["b/own-blobs"], Layers: bOwnLayers}), false, false},
	}
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			// The runtime's own failure of B's pull, straight to it (CRI-O's
			// of most families): through the proxy B's pull may fail the same.
			var runtimeFails string
			t.Run("control: straight to the runtime, B's container reads A's file, or the runtime fails B's pull itself", func(t *testing.T) {
				r := crictl(t, direct(), "pull", f.image)
				if testRig.Runtime.CRIO() && !f.crio {
					if r.Err == nil {
						t.Fatalf("%s pulled it, which this test takes it to fail: %s", testRig.Runtime.Name, r.Stdout)
					}
					if id, held := runtimeImage(t, f.image); held {
						t.Fatalf("%s failed the pull but holds B's name, as %s", testRig.Runtime.Name, id)
					}
					runtimeFails = crictlMessage(r.Stderr)
					t.Logf("%s fails B's pull by itself: %s", testRig.Runtime.Name, runtimeFails)
					return
				}
				if r.Err != nil {
					t.Fatalf("the pull failed: the test's premise is wrong: %v\n%s", r.Err, r.Stderr)
				}
				id := imageID(t, f.image)
				if f.sameID && !sameImage(id, a.id) {
					t.Fatalf("B's name stands for %s, not A's image %s", id, a.id)
				}
				if err := bob.reads(t, direct(), f.image, marker); err != nil {
					t.Fatalf("B's container did not read A's file: the test's premise is wrong: %v", err)
				}
				if !f.sameID {
					// The image came around the proxy: through it, by B's name
					// and by its ID, it is refused to B and to C.
					for _, tn := range []tenant{bob, carol} {
						for _, ref := range []string{f.image, id} {
							if err := tn.creates(t, p.ep, ref); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
								t.Errorf("through the proxy, %s's container of %s (it came around the proxy): %v", tn.name, ref, err)
							}
						}
					}
				}
				// containerd removes an image with all its names: with B's name
				// on A's image, A's goes too, and A pulls it again.
				crictl(t, direct(), "rmi", id)
				if f.sameID {
					pullA(t)
				}
			})
			t.Run("through the proxy: B's pull is refused, what the runtime left is hidden, B and C are refused by every name", func(t *testing.T) {
				r := bob.pull(t, p.ep, f.image)
				msg := crictlMessage(r.Stderr)
				refused := strings.Contains(msg, "PermissionDenied") || (runtimeFails != "" && msg == runtimeFails)
				if r.Err == nil || !refused || !strings.Contains(r.Stderr, f.image) || strings.Contains(r.Stderr, hexA) {
					t.Errorf("B's pull: want PermissionDenied (or the runtime's own failure, as straight to it) naming B's image and not A's ID: %v\n%s", r.Err, r.Stderr)
				}
				// The runtime pulls beside the check: what it left under B's
				// name is tracked, and hidden from every pod.
				if _, ok := runtimeImage(t, f.image); ok {
					if r := crictl(t, p.ep, "inspecti", f.image); r.Err == nil {
						t.Errorf("the runtime holds %s and the proxy shows it", f.image)
					}
				}
				for _, tn := range []tenant{bob, carol} {
					for _, ref := range []string{f.image, idA, hexA[:16]} {
						if err := tn.refused(t, p.ep, ref); err != nil {
							t.Error(err)
						}
					}
				}
			})
		})
	}

	t.Run("a copy of B's own (A's blobs pushed to B's registry) works for B once its bytes are proven, then without fetching again", func(t *testing.T) {
		b.Put("b/copy", "blobs", a.id, "application/vnd.oci.image.config.v1+json", a.config)
		for _, l := range a.layers {
			b.Blob("b/copy", l)
		}
		image := b.Manifest(t, "b/copy", "v1", a.mediaType, a.manifest)
		b.Served()
		if r := bob.pull(t, p.ep, image); r.Err != nil {
			t.Fatalf("B's pull of its copy: %v\n%s", r.Err, r.Stderr)
		}
		// A's marker layer is private (the busybox layer under it may be
		// public: held by images on the node before): its bytes were served.
		if got, marker := b.Served(), int64(len(a.layers[len(a.layers)-1])); got < marker {
			t.Errorf("B's registry served %d bytes, fewer than the private layer's %d: the copy's layers were not proven", got, marker)
		}
		if err := bob.reads(t, p.ep, image, marker); err != nil {
			t.Errorf("B's container of its copy: %v", err)
		}
		bob2 := newTenant(t, "nd-bob2", "")
		if r := bob2.pull(t, p.ep, image); r.Err != nil {
			t.Fatalf("B's second pod: %v\n%s", r.Err, r.Stderr)
		}
		if err := bob2.reads(t, p.ep, image, marker); err != nil {
			t.Errorf("B's second pod's container: %v", err)
		}
		if got := b.Served(); got != 0 {
			t.Errorf("B's registry served %d bytes for B's second pod, want a re-use", got)
		}
		if out, err := p.records(t, "explain", image); err != nil || !strings.Contains(out, "proven") {
			t.Errorf("records explain does not say the layers were proven by their bytes: %v\n%s", err, out)
		}
	})
}

// configDesc is A's config's descriptor.
func configDesc(a leakedImage) v1.Descriptor {
	h, _ := v1.NewHash(a.id)
	return v1.Descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: h, Size: int64(len(a.config))}
}

// reads runs a container of image in a sandbox of tn's through ep and
// waits until it printed marker (A's file); it returns the step's error.
func (tn tenant) reads(t *testing.T, ep, image, marker string) error {
	t.Helper()
	sandbox := strings.TrimSpace(mustCrictl(t, ep, "runp", tn.config))
	defer func() { crictl(t, direct(), "stopp", sandbox); crictl(t, direct(), "rmp", sandbox) }()
	containers++
	r := crictl(t, ep, "create", sandbox, containerConfig(t, fmt.Sprintf("%s-%d", tn.name, containers), image, "cat /marker; sleep 3600"), tn.config)
	if r.Err != nil {
		return fmt.Errorf("create: %s", crictlMessage(r.Stderr))
	}
	ctr := strings.TrimSpace(r.Stdout)
	defer crictl(t, direct(), "rm", "-f", ctr)
	if r := crictl(t, ep, "start", ctr); r.Err != nil {
		return fmt.Errorf("start: %s", crictlMessage(r.Stderr))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := crictl(t, ep, "logs", ctr)
		if strings.Contains(out.Stdout, marker) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the container printed %q, not the marker", out.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// creates creates (and removes) a container of image in a sandbox of tn's
// through ep; it returns crictl's error, with its message.
// refused reports nil when the proxy at ep refuses tn a container of
// image (PermissionDenied), or lets the create through to a runtime that
// fails it by itself as it does straight to it (an image it does not hold
// by that name); else what happened instead. A failure of any kind is not
// a refusal: an image the runtime would run must be refused by the proxy.
func (tn tenant) refused(t *testing.T, ep, image string) error {
	t.Helper()
	err := tn.creates(t, ep, image)
	switch {
	case err == nil:
		return fmt.Errorf("%s created a container of %s", tn.name, image)
	case strings.Contains(err.Error(), "PermissionDenied"):
		return nil
	case tn.creates(t, direct(), image) == nil:
		return fmt.Errorf("%s's create of %s failed through the proxy without its refusal (%v), and succeeds straight to the runtime", tn.name, image, err)
	}
	return nil
}

func (tn tenant) creates(t *testing.T, ep, image string) error {
	t.Helper()
	sandbox := strings.TrimSpace(mustCrictl(t, ep, "runp", tn.config))
	defer func() { crictl(t, direct(), "stopp", sandbox); crictl(t, direct(), "rmp", sandbox) }()
	containers++
	r := crictl(t, ep, "create", sandbox, containerConfig(t, fmt.Sprintf("%s-%d", tn.name, containers), image, "true"), tn.config)
	if r.Err != nil {
		return fmt.Errorf("%s", crictlMessage(r.Stderr))
	}
	crictl(t, direct(), "rm", "-f", strings.TrimSpace(r.Stdout))
	return nil
}
