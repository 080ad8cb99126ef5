package registry

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/auth"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FuzzParseManifest feeds registry answers to the manifest parser: it must
// never panic, and what it accepts must be usable as it is.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"digest":"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","size":2},"layers":[]}`), "")
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","size":2,"platform":{"os":"linux","architecture":"amd64"}}]}`), ocispec.MediaTypeImageIndex)
	f.Add([]byte(`{"schemaVersion":1,"fsLayers":[]}`), "application/json")
	f.Add([]byte(`{"schemaVersion":2,"config":{"digest":"sha256:x"},"manifests":[]}`), "")
	f.Add([]byte(`null`), mediaTypeDockerManifest)
	f.Fuzz(func(t *testing.T, body []byte, mediaType string) {
		m, err := parseManifest(body, mediaType)
		if err != nil {
			return
		}
		if m.index {
			if m.config.Digest != "" || m.layers != nil {
				t.Fatalf("an index with a manifest's fields: %+v", m)
			}
			for _, d := range m.manifests {
				if d.Digest.Validate() != nil || d.Size < 0 {
					t.Fatalf("accepted entry %+v", d)
				}
			}
			pickManifest(m.manifests, platforms.Only(platforms.DefaultSpec()))
			return
		}
		for _, d := range append([]ocispec.Descriptor{m.config}, m.layers...) {
			if d.Digest.Validate() != nil || d.Size < 0 {
				t.Fatalf("accepted descriptor %+v", d)
			}
		}
	})
}

// FuzzChallengeRoundTrip: a remembered challenge, written as a header,
// reads back through containerd's parser as the same challenge (how a new
// check's authorizer is seeded), and a registry's header never panics it.
func FuzzChallengeRoundTrip(f *testing.F) {
	f.Add("https://auth.example/token", "registry.example", true, `Bearer realm="https://auth.example/token",service="r",scope="repository:a:pull"`)
	f.Add(`a "quoted\ realm`, `s\`, false, `Basic realm="x"`)
	f.Add("", "", true, `Bearer realm=,`)
	f.Fuzz(func(t *testing.T, realm, service string, bearer bool, registryHeader string) {
		challengeFrom(http.Header{"Www-Authenticate": []string{registryHeader}})

		c := challenge{scheme: auth.BasicAuth, realm: realm}
		if bearer {
			if realm == "" {
				return // never remembered: containerd needs a realm
			}
			c = challenge{scheme: auth.BearerAuth, realm: realm, service: service}
		}
		got, ok := challengeFrom(http.Header{"Www-Authenticate": []string{c.header()}})
		if !ok || got != c {
			t.Fatalf("%+v written as %q reads back as %+v (%v)", c, c.header(), got, ok)
		}
	})
}

// FuzzParseRegistriesConf feeds files to the registries.conf parser: it
// must never panic, what it accepts must hold what the check relies on,
// and matching and rewriting any reference under it must not panic.
func FuzzParseRegistriesConf(f *testing.F) {
	for _, p := range append([]string{"testdata/registries.conf", "testdata/registries.conf.d/10-override.conf"}, mustGlob(f, "testdata/malformed/*.conf")...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "registry.example/team/app")
	}
	f.Add([]byte("[[registry]]\nprefix = \"*.x\"\n[[registry]]\nprefix = \"a/b\"\nlocation = \"c\"\n"), "a/b/c")
	f.Fuzz(func(t *testing.T, b []byte, ref string) {
		regs, err := parseRegistriesConf(b)
		if err != nil {
			return
		}
		rc := &registriesConf{registries: regs}
		for _, r := range regs {
			wild := strings.HasPrefix(r.Prefix, "*.")
			switch {
			case strings.HasSuffix(r.Prefix, "/"):
				t.Fatalf("accepted prefix %q", r.Prefix) // containers/image trims the slashes
			case wild && strings.ContainsAny(r.Prefix, "/@:"):
				t.Fatalf("accepted wildcard %q", r.Prefix)
			case !wild && r.Location == "":
				t.Fatalf("accepted %q with no location", r.Prefix)
			case strings.HasPrefix(r.Location, "http://") || strings.HasPrefix(r.Location, "https://"):
				t.Fatalf("accepted location %q", r.Location)
			}
			for _, m := range r.Mirrors {
				if m.Location == "" {
					t.Fatalf("accepted a mirror of %q with no location", r.Prefix)
				}
			}
		}
		if r := rc.find(ref); r != nil {
			if prefixMatch(ref, r.Prefix) == -1 {
				t.Fatalf("%q found %q, which does not match it", ref, r.Prefix)
			}
			if d, p, err := r.rewrite(ref, r.confEndpoint); err == nil && (d == "" || p == "") {
				t.Fatalf("%q rewritten under %q to %q %q", ref, r.Prefix, d, p)
			}
			planFor(r, locationHost(ref), ref)
		}
	})
}

func mustGlob(f *testing.F, pattern string) []string {
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		f.Fatalf("%s: %v (%d files)", pattern, err, len(m))
	}
	return m
}
