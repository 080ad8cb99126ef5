package imageref

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	id := "sha256:" + "1111111111111111111111111111111111111111111111111111111111111111"
	for _, tc := range []struct {
		name, in   string
		repo, ref  string
		ok, isID   bool
		maybePrefx bool
	}{
		{"a short name gets docker.io/library and the default tag", "nginx", "docker.io/library/nginx", "docker.io/library/nginx:latest", true, false, false},
		{"a tagged name keeps its tag", "registry.test/team/app:v1", "registry.test/team/app", "registry.test/team/app:v1", true, false, false},
		{"a digested name keeps its digest, no tag added", "registry.test/app@" + id, "registry.test/app", "registry.test/app@" + id, true, false, false},
		{"an image ID is no name, though it would parse as docker.io/library/sha256", id, "", "", false, true, true},
		{"a bare 64-hex ID is no name", id[7:], "", "", false, true, true},
		{"a short hex string is a name that may also be an ID prefix", "1111111111", "docker.io/library/1111111111", "docker.io/library/1111111111:latest", true, false, true},
		{"an upper-case repository does not parse", "Registry.test/App", "", "", false, false, false},
		{"an empty string is nothing", "", "", "", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Names
			for _, n := range []Name{Parse(tc.in), c.Parse(tc.in), c.Parse(tc.in)} {
				if n.Repository != tc.repo || n.Ref != tc.ref || n.OK != tc.ok {
					t.Errorf("Parse(%q) = %+v, want %q %q %v", tc.in, n, tc.repo, tc.ref, tc.ok)
				}
			}
			if IsID(tc.in) != tc.isID || MayBeIDPrefix(tc.in) != tc.maybePrefx {
				t.Errorf("IsID %v, MayBeIDPrefix %v", IsID(tc.in), MayBeIDPrefix(tc.in))
			}
		})
	}
}

func TestLookupIsTheNameTheRuntimeResolves(t *testing.T) {
	t.Parallel()
	d := "sha256:" + strings.Repeat("ab", 32)
	for in, want := range map[string]string{
		"nginx":                             "docker.io/library/nginx:latest",
		"registry.test/team/app:v1":         "registry.test/team/app:v1",
		"registry.test/team/app@" + d:       "registry.test/team/app@" + d,
		"registry.test/team/app:v1@" + d:    "registry.test/team/app@" + d,
		"sha256:" + strings.Repeat("1", 64): "",
	} {
		if got := Parse(in).Lookup(); got != want {
			t.Errorf("Parse(%q).Lookup() = %q, want %q", in, got, want)
		}
	}
}

func TestDigestIsTheManifestANamePins(t *testing.T) {
	t.Parallel()
	d := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct{ in, repo, digest string }{
		{"registry.test/team/app@" + d, "registry.test/team/app", d},
		{"registry.test/team/app:v1@" + d, "registry.test/team/app", d},
		{"registry.test/team/app:v1", "registry.test/team/app", ""},
		{"registry.test/team/app@sha256:short", "", ""},
		{"registry.test/a@b@" + d, "", ""},
	} {
		n := Parse(tc.in)
		if n.Repository != tc.repo || n.Digest() != tc.digest {
			t.Errorf("Parse(%q): repository %q, digest %q; want %q, %q", tc.in, n.Repository, n.Digest(), tc.repo, tc.digest)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"nginx", "registry.test/a/b:v1@sha256:" + "11111111111111111111111111111111111111111111111111111111111111ab", "sha256:", "a:b:c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := Parse(s)
		if n.OK && IsID(s) {
			t.Fatalf("%q is both an ID and a name", s)
		}
		if !n.OK {
			return
		}
		// Normalizing is idempotent: the kubelet and the runtime may hand
		// back either form.
		if again := Parse(n.Ref); !again.OK || again.Ref != n.Ref || again.Repository != n.Repository {
			t.Fatalf("Parse(%q) = %+v, but Parse(%q) = %+v", s, n, n.Ref, again)
		}
	})
}

func TestNamesNoImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    string
		want bool
	}{
		{"a short name may name an image", "nginx", false},
		{"a full reference may name an image", "registry.test:5000/team/app:v1", false},
		{"an ID may name an image", "sha256:" + strings.Repeat("a", 64), false},
		{"a hex string may be an ID prefix", "deadbeef", false},
		{"words with spaces name nothing", "Not A Name", true},
		{"a checkpoint archive's path names no image", "/var/lib/checkpoint.tar", true},
		{"an upper-case repository names nothing", "Registry/App", true},
		{"a string longer than any reference names nothing", strings.Repeat("a", 2000) + "/x", true},
		{"the empty string is a prefix of every ID", "", false},
	} {
		if got := NamesNoImage(tc.s); got != tc.want {
			t.Errorf("%s: NamesNoImage(%.40q) = %v, want %v", tc.name, tc.s, got, tc.want)
		}
	}
}

// TestNamesCostBoundedMemoryWhateverTheyAreGiven: a socket client can send
// any string as an image name (up to the 16 MiB message limit). Names that
// no reference can have are never remembered, and what is remembered is
// bounded in bytes, so 1,000 distinct oversized names leave the live heap
// within a few MiB of where it started.
func TestNamesCostBoundedMemoryWhateverTheyAreGiven(t *testing.T) {
	var names Names
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	start := heap()
	big := strings.Repeat("a", 1<<20)
	for i := range 1000 {
		s := fmt.Sprintf("registry.test/%d/%s:v1", i, big) // no repository is this long
		if n := names.Parse(s); n.OK {
			t.Fatalf("a 1 MiB name parsed as a reference")
		}
	}
	// Long but valid names: remembered, within the byte bound.
	for i := range 10000 {
		names.Parse(fmt.Sprintf("registry.test/%s/app-%d:v1", strings.Repeat("b", 200), i))
	}
	if grown := int64(heap()) - int64(start); grown > 8<<20 {
		t.Errorf("the live heap grew by %d MiB; want a few at most", grown>>20)
	}
	if b := names.bytes.Load(); b > maxRememberedBytes {
		t.Errorf("%d bytes remembered, bound %d", b, maxRememberedBytes)
	}
}
