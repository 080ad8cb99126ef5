package keyring

import (
	"strings"
	"testing"
)

func TestMatchImageAsReached(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, pattern, image string
		want                 bool
	}{
		// What the kubelet's rule matches, this one matches too.
		{"an exact registry matches its images", "registry.example.com", "registry.example.com/team/app", true},
		{"a subdomain glob matches one label", "*.example.com", "eu.example.com/app", true},
		{"a subdomain glob does not span two labels", "*.example.com", "a.b.example.com/app", false},
		{"a path is a string prefix", "registry.example.com/team", "registry.example.com/teamwork/app", true},
		{"a longer path does not match", "registry.example.com/team/app/x", "registry.example.com/team/app", false},
		{"another registry does not match", "registry.example.com", "other.example.com/app", false},
		{"another port does not match", "registry.example.com:5000", "registry.example.com:5001/app", false},
		{"a pattern's port does not match no port when it is no default port", "registry.example.com:5000", "registry.example.com/app", false},
		{"a pattern without port does not match a port that is no default port", "registry.example.com", "registry.example.com:5000/app", false},

		// Case: host names are case-insensitive.
		{"an upper-case image host matches a lower-case pattern", "registry.example.com", "REGISTRY.EXAMPLE.COM/team/app", true},
		{"a mixed-case pattern matches a lower-case image", "Registry.Example.COM", "registry.example.com/team/app", true},
		{"a glob matches an upper-case label", "*.example.com", "EU.Example.com/app", true},
		{"LOCALHOST is localhost", "localhost:5000", "LOCALHOST:5000/app", true},
		{"the path stays case-sensitive", "registry.example.com/Team", "registry.example.com/team/app", false},

		// Default ports: 443 is https's, 80 plain http's.
		{"an image with :443 matches a pattern without port", "registry.example.com", "registry.example.com:443/team/app", true},
		{"an image with :80 matches a pattern without port", "registry.example.com", "registry.example.com:80/team/app", true},
		{"a pattern with :443 matches an image without port", "registry.example.com:443", "registry.example.com/team/app", true},
		{"a pattern with :443 matches an image with :443", "registry.example.com:443/team", "registry.example.com:443/team/app", true},
		{"a pattern with :80 matches an image without port", "registry.example.com:80", "registry.example.com/team/app", true},
		{"a pattern with :443 does not match :80: no scheme has both for default", "registry.example.com:443", "registry.example.com:80/app", false},
		{"a pattern with :80 does not match :443", "registry.example.com:80", "registry.example.com:443/app", false},
		{"a glob pattern matches an image with :443", "*.example.com", "eu.example.com:443/app", true},
		{"a port with leading zeros is that port", "registry.example.com", "registry.example.com:0443/app", true},
		{"case and default port together", "registry.example.com/team", "REGISTRY.example.com:443/team/app", true},

		// Explicit ports in a pattern.
		{"a pattern's explicit port matches that port", "registry.example.com:5000", "registry.example.com:5000/app", true},
		{"an explicit port matches under case folding", "registry.example.com:5000", "Registry.Example.Com:5000/app", true},
		{"an IP pattern with port matches", "127.0.0.1:5000", "127.0.0.1:5000/team/app", true},
		{"an IP glob matches an IP label", "127.0.0.*:5000", "127.0.0.1:5000/app", true},

		// IPv6 literals.
		{"an IPv6 literal matches itself", "[::1]:5000", "[::1]:5000/app", true},
		{"an IPv6 literal matches its other spellings", "[::1]:5000", "[0:0:0:0:0:0:0:1]:5000/app", true},
		{"an IPv6 literal's hex digits are case-insensitive", "[fd00::1]", "[FD00::1]/app", true},
		{"an IPv6 literal without port matches :443", "[fd00::1]", "[fd00::1]:443/app", true},
		{"another IPv6 address does not match", "[fd00::1]", "[fd00::2]/app", false},
		{"an IPv4-mapped IPv6 literal is its IPv4 address", "127.0.0.1:5000", "[::ffff:7f00:1]:5000/app", true},
		{"an IPv6 literal is no host name", "[::1]:5000", "localhost:5000/app", false},

		// What matches nothing.
		{"a malformed glob matches nothing", "registry-[.io", "registry-[.io/app", false},
		{"an image that does not parse matches nothing", "registry.example.com", "registry.example.com:x/app", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MatchImageAsReached(tc.pattern, tc.image); got != tc.want {
				t.Errorf("MatchImageAsReached(%q, %q) = %v, want %v", tc.pattern, tc.image, got, tc.want)
			}
		})
	}
}

// TestCredentialMatchingStaysTheKubelets: credential providers keep the
// kubelet's rule, which fails closed for credentials (a spelling it does
// not match gets no credential).
func TestCredentialMatchingStaysTheKubelets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ pattern, image string }{
		{"registry.example.com", "REGISTRY.EXAMPLE.COM/app"},
		{"registry.example.com", "registry.example.com:443/app"},
		{"registry.example.com:443", "registry.example.com/app"},
	} {
		if MatchImage(tc.pattern, tc.image) {
			t.Errorf("MatchImage(%q, %q) = true: the kubelet's rule does not fold case or default ports", tc.pattern, tc.image)
		}
		if !MatchImageAsReached(tc.pattern, tc.image) {
			t.Errorf("MatchImageAsReached(%q, %q) = false", tc.pattern, tc.image)
		}
	}
}

func TestCanonicalRepository(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"a canonical repository is itself", "registry.example.com/team/app", "registry.example.com/team/app"},
		{"the host is case-folded, the path kept", "REGISTRY.Example.com/team/app", "registry.example.com/team/app"},
		{"a default port is kept: it may be a port of its own", "registry.example.com:443/team/app", "registry.example.com:443/team/app"},
		{"a port loses its leading zeros", "registry.example.com:0443/app", "registry.example.com:443/app"},
		{"an IPv6 literal is canonical", "[0:0:0:0:0:0:0:1]:5000/app", "[::1]:5000/app"},
		{"an IPv6 literal is lower-case", "[FD00::1]/app", "[fd00::1]/app"},
		{"an IPv4-mapped IPv6 literal is its IPv4 address", "[::ffff:7f00:1]:5000/app", "127.0.0.1:5000/app"},
		{"an IPv4 address is itself", "127.0.0.1:5000/app", "127.0.0.1:5000/app"},
		{"Docker Hub is itself", "docker.io/library/nginx", "docker.io/library/nginx"},
		{"a host alone is canonical too", "LOCALHOST:5000", "localhost:5000"},
		{"no repository is none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CanonicalRepository(tc.in); got != tc.want {
				t.Errorf("CanonicalRepository(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSameHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"registry.example.com", "REGISTRY.example.com", true},
		{"registry.example.com", "registry.example.com:443", true},
		{"registry.example.com:80", "registry.example.com", true},
		{"registry.example.com:443", "registry.example.com:80", false},
		{"127.0.0.1:5000", "127.0.0.1:5000", true},
		{"[::1]:5000", "[0::1]:5000", true},
		{"127.0.0.1:5000", "127.0.0.1:5001", false},
		{"registry.example.com", "other.example.com", false},
	} {
		if got := SameHost(tc.a, tc.b); got != tc.want {
			t.Errorf("SameHost(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// FuzzMatchImageAsReached: image names are tenant input. Whatever the
// spelling, a repository matches a pattern exactly when its canonical
// form does (case and IP spellings never change a decision), and what
// the kubelet's rule matches this one matches too (image policy covers
// at least what credentials do), bar IPv6 literals, which the kubelet's
// rule reads as a glob's character class.
func FuzzMatchImageAsReached(f *testing.F) {
	for _, s := range [][2]string{
		{"registry.example.com", "REGISTRY.EXAMPLE.COM:443/team/app"},
		{"*.example.com:5000", "eu.example.com:5000/app"},
		{"[::1]:5000", "[0:0::1]:5000/app"},
		{"127.0.0.*", "127.0.0.1:80/app"},
		{"registry.example.com:80/team", "Registry.Example.Com/team/x"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, repo string) {
		got := MatchImageAsReached(pattern, repo)
		if canon := CanonicalRepository(repo); MatchImageAsReached(pattern, canon) != got {
			t.Fatalf("MatchImageAsReached(%q, %q) = %v, but for its canonical form %q: %v", pattern, repo, got, canon, !got)
		}
		if MatchImage(pattern, repo) && !got && ValidateMatchImage(pattern) == nil && !strings.ContainsAny(pattern+repo, "[%") {
			t.Fatalf("the kubelet's rule matches %q to %q, the image policy's does not", pattern, repo)
		}
	})
}
