package registry

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadRegistriesConfMergesTheDropIns(t *testing.T) {
	rc, err := loadRegistriesConf("testdata/registries.conf")
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []string{"testdata/registries.conf", filepath.Join("testdata", "registries.conf.d", "10-override.conf")}
	if strings.Join(rc.files, " ") != strings.Join(wantFiles, " ") {
		t.Errorf("read %v, want %v (README has no .conf suffix)", rc.files, wantFiles)
	}
	var prefixes []string
	for _, r := range rc.registries {
		prefixes = append(prefixes, r.Prefix)
	}
	// Sorted by prefix, as containers/image keeps them: the order in which
	// it breaks a tie.
	want := "*.wild.example blocked.example blocked.example/allowed docker.io dropin.example exact.wild.example insecure.example:5000 moved.example/old-team proxied.example public.example registry.example"
	if got := strings.Join(prefixes, " "); got != want {
		t.Errorf("prefixes %s\nwant     %s", got, want)
	}
	r := rc.find("registry.example/team/app")
	if r == nil || len(r.Mirrors) != 1 || !strings.HasSuffix(r.file, "10-override.conf") {
		t.Errorf("registry.example: got %+v, want the drop-in's entry with one mirror", r)
	}
}

func TestLoadRegistriesConfOfAMissingFileIsEmpty(t *testing.T) {
	rc, err := loadRegistriesConf(filepath.Join(t.TempDir(), "registries.conf"))
	if err != nil || len(rc.registries) != 0 || len(rc.files) != 0 {
		t.Fatalf("got %+v, %v; want an empty configuration, as CRI-O has it", rc, err)
	}
}

func TestMalformedRegistriesConfIsAnErrorNamingTheFileAndTheProblem(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"a string left open is a syntax error with its line", "syntax.conf", "line 2"},
		{"the v1 format is refused, as containers/image refuses it", "v1.conf", "v1 format"},
		{"a location with a URL scheme is refused", "scheme.conf", "takes no URL scheme"},
		{"a prefix without a location, not a wildcard, is refused", "no-location.conf", "location is not set"},
		{"an entry with neither prefix nor location is refused", "empty-entry.conf", "neither prefix nor location"},
		{"a wildcard prefix with a path is refused", "wildcard-path.conf", "wildcard prefix"},
		{"a mirror without a location is refused", "mirror-no-location.conf", "mirror 1: location is not set"},
		{"one location both insecure and not is refused", "conflict.conf", "conflicting insecure"},
		{"a value of the wrong type is refused", "type.conf", "insecure"},
		{"an unknown pull-from-mirror is refused", "pull-from-mirror.conf", `pull-from-mirror "sometimes"`},
		{"an unknown short-name-mode is refused", "short-name-mode.conf", `short-name-mode "lenient"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "malformed", tc.file)
			_, err := loadRegistriesConf(path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s and %q", err, path, tc.want)
			}
			if _, err := New(Options{RegistriesConf: path}); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("New: got %v, want the same error", err)
			}
		})
	}
}

func TestPrefixMatchingAsContainersImage(t *testing.T) {
	rc := &registriesConf{}
	for _, p := range []string{"*.example.com", "a.example.com", "example.com", "example.com/team", "registry.example.com", "reg.example"} {
		rc.registries = append(rc.registries, confRegistry{Prefix: p})
	}
	for _, tc := range []struct {
		name, ref, want string
	}{
		{"a host matches its own entry", "example.com/app", "example.com"},
		{"the longest prefix wins: a namespace over its host", "example.com/team/app", "example.com/team"},
		{"a prefix matches at a path boundary only", "example.com/teamx/app", "example.com"},
		{"a prefix matches no longer host", "example.community/app", ""},
		{"a wildcard matches a host under its domain", "b.example.com/app", "*.example.com"},
		{"a wildcard matches hosts several levels down", "x.y.example.com/app", "*.example.com"},
		{"a wildcard does not match the domain itself", "example.com.evil/app", ""},
		{"an exact host longer than the wildcard wins", "registry.example.com/app", "registry.example.com"},
		{"a wildcard and an exact host of the same length: the first by prefix order wins, as containers/image", "a.example.com/app", "*.example.com"},
		{"a host with a port matches its host's prefix, as containers/image (a quirk it documents)", "reg.example:5000/app", "reg.example"},
		{"a wildcard never matches within the path", "other.io/x.example.com/app", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if r := rc.find(tc.ref); r != nil {
				got = r.Prefix
			}
			if got != tc.want {
				t.Errorf("%s matched %q, want %q", tc.ref, got, tc.want)
			}
		})
	}
}

func TestRegconfEndpoint(t *testing.T) {
	c, err := New(Options{RegistriesConf: "testdata/registries.conf", CertsDir: t.TempDir(),
		Vouched: []VouchedMirror{{Registry: "vouched.example", Endpoint: "https://vouched-cache.example"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, image, want, repository, ns string
		fallback, vouched                 bool
		err                               error
	}{
		{name: "a registry with mirrors is asked itself, never a mirror", image: "registry.example/team/app:v1", want: "https://registry.example/v2"},
		{name: "a registry with no entry is asked over https", image: "quay.io/team/app:v1", want: "https://quay.io/v2"},
		{name: "Docker Hub is registry-1.docker.io, its mirror not asked", image: "nginx:1.27", want: "https://registry-1.docker.io/v2"},
		{name: "an insecure registry is asked over https unverified, then plain http", image: "insecure.example:5000/team/app:v1", want: "https://insecure.example:5000/v2", fallback: true},
		{name: "a registry a drop-in adds is read", image: "dropin.example/app:v1", want: "https://dropin.example/v2", fallback: true},
		{name: "a blocked registry is refused", image: "blocked.example/team/app:v1", err: ErrDenied},
		{name: "a longer prefix under a blocked one is its own entry", image: "blocked.example/allowed/app:v1", want: "https://blocked.example/v2"},
		{name: "a host under a wildcard is its own registry, with the wildcard's insecure", image: "a.wild.example/app:v1", want: "https://a.wild.example/v2", fallback: true},
		{name: "an exact host under a wildcard takes its own entry", image: "exact.wild.example/app:v1", want: "https://exact.wild.example/v2"},
		{name: "a location on the registry's host moves the repository", image: "moved.example/old-team/app:v1", want: "https://moved.example/v2", repository: "new-team/app"},
		{name: "a location on another host is not asked: the image's own host is, verified", image: "public.example/team/app:v1", want: "https://public.example/v2"},
		{name: "a namespace-proxy adds its ns argument", image: "proxied.example/app:v1", want: "https://proxied.example/v2", ns: "upstream.example"},
		{name: "a vouched mirror is asked instead", image: "vouched.example/app:v1", want: "https://vouched-cache.example/v2", vouched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, err := parseImage(tc.image)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := c.regconfEndpoint(name)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), "blocked by the node's registries.conf") || !strings.Contains(err.Error(), "testdata/registries.conf") {
					t.Fatalf("got %v, want %v naming the file", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, fallback := ep.host.Client.Transport.(interface{ CloseIdleConnections() })
			fallback = !fallback // the http fallback wraps the transport
			if ep.String() != tc.want || ep.repository != tc.repository || ep.namespace() != tc.ns || ep.vouched != tc.vouched || fallback != tc.fallback {
				t.Errorf("got %s (repository %q, ns %q, vouched %v, http fallback %v); want %s (%q, %q, %v, %v)",
					ep, ep.repository, ep.namespace(), ep.vouched, fallback, tc.want, tc.repository, tc.ns, tc.vouched, tc.fallback)
			}
		})
	}
	if _, err := c.Check(context.Background(), Request{Image: "blocked.example/team/app:v1"}); !errors.Is(err, ErrDenied) {
		t.Errorf("Check of a blocked registry: got %v, want ErrDenied", err)
	} else if e := (*Error)(nil); !errors.As(err, &e) || e.Reason != "blocked by the node's registries.conf" {
		t.Errorf("Check of a blocked registry: got %#v, want the reason for the pod", err)
	}
}
