package keyring

import "testing"

func TestMatchImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, pattern, image string
		want                 bool
	}{
		// The examples of KEP-2133 and the kubelet's config documentation.
		{"an exact registry matches its images", "123456789.dkr.ecr.us-east-1.amazonaws.com", "123456789.dkr.ecr.us-east-1.amazonaws.com/app", true},
		{"a subdomain glob matches one label", "*.azurecr.io", "myregistry.azurecr.io/team/app", true},
		{"a subdomain glob does not span two labels", "*.azurecr.io", "a.b.azurecr.io/app", false},
		{"a subdomain glob needs a label", "*.azurecr.io", "azurecr.io/app", false},
		{"a registry matches its own images", "gcr.io", "gcr.io/project/app", true},
		{"two globs match two labels", "*.*.registry.io", "a.b.registry.io/x", true},
		{"two globs do not match three labels", "*.*.registry.io", "a.b.c.registry.io/x", false},
		{"a glob in the middle matches", "k8s.*.io", "k8s.gcr.io/pause", true},
		{"a top-level-domain glob matches", "k8s.*", "k8s.io/x", true},
		{"a partial label glob matches", "app*.k8s.io", "app1.k8s.io/x", true},
		{"a partial label glob does not match another prefix", "app*.k8s.io", "web.k8s.io/x", false},
		{"*.io does not match a deeper domain", "*.io", "foo.k8s.io/x", false},
		{"a pattern with port matches that port", "registry.io:8080/path", "registry.io:8080/path/app", true},
		{"a pattern with port does not match another port", "registry.io:8080/path", "registry.io:8081/path/app", false},
		{"a pattern with port does not match no port", "registry.io:8080", "registry.io/app", false},
		{"a pattern without port does not match an image with port", "registry.io", "registry.io:5000/app", false},
		{"a path is a prefix", "registry.io/team", "registry.io/team/app", true},
		{"a path prefix is a string prefix, as in the kubelet", "registry.io/team", "registry.io/teamwork/app", true},
		{"a longer path does not match a shorter image path", "registry.io/team/app/extra", "registry.io/team/app", false},
		{"another registry does not match", "registry.io", "other.io/app", false},
		{"an IP registry with port matches", "127.0.0.1:5000", "127.0.0.1:5000/team-a/app", true},
		{"an IP glob matches an IP label", "127.0.0.*:5000", "127.0.0.1:5000/team-a/app", true},
		{"an IP registry does not match another IP", "127.0.0.1:5000", "127.0.0.2:5000/app", false},
		{"globs do not apply to the port", "registry.io:*", "registry.io:5000/app", false},
		{"a bracket glob cannot parse as a URL host, so it matches nothing (as in the kubelet)", "registry-[ab].io", "registry-b.io/app", false},
		{"a malformed glob matches nothing", "registry-[.io", "registry-[.io/app", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MatchImage(tc.pattern, tc.image); got != tc.want {
				t.Errorf("MatchImage(%q, %q) = %v, want %v", tc.pattern, tc.image, got, tc.want)
			}
		})
	}
}

func TestAuthKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"a host stays a host", "registry.io", "registry.io"},
		{"a scheme is dropped", "https://registry.io", "registry.io"},
		{"an http scheme is dropped", "http://127.0.0.1:5000", "127.0.0.1:5000"},
		{"a /v1/ path means the host", "https://index.docker.io/v1/", "index.docker.io"},
		{"a /v2/ path means the host", "registry.io/v2/", "registry.io"},
		{"a repository path is kept", "registry.io/team", "registry.io/team"},
		{"a trailing slash alone is the host", "registry.io/", "registry.io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AuthKey(tc.in)
			if !ok || got != tc.want {
				t.Errorf("AuthKey(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
			}
		})
	}
}

// FuzzMatchImage: matching never panics, a pattern always matches itself
// when it has no glob, and a match implies equal ports.
func FuzzMatchImage(f *testing.F) {
	for _, s := range [][2]string{
		{"*.azurecr.io", "a.azurecr.io/x"}, {"registry.io:8080/p", "registry.io:8080/p/q"},
		{"[", "["}, {"127.0.0.1:5000", "127.0.0.1:5000/a"}, {"%zz", "x"}, {"a/b", "a/b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, image string) {
		got := MatchImage(pattern, image)
		g, gerr := ParseSchemelessURL(pattern)
		i, ierr := ParseSchemelessURL(image)
		if got && (gerr != nil || ierr != nil) {
			t.Fatalf("unparsable input matched: %q %q", pattern, image)
		}
		if got && g.Port() != i.Port() {
			t.Fatalf("%q matched %q across ports", pattern, image)
		}
		if gerr == nil && !IsWildcard(pattern) && g.Host != "" && g.RawQuery == "" && g.Fragment == "" && !MatchImage(pattern, pattern) {
			t.Fatalf("%q does not match itself", pattern)
		}
	})
}
