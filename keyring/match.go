package keyring

import (
	"net"
	"net/url"
	"path/filepath"
	"strings"
)

// ParseSchemelessURL parses an image or pattern that has no scheme, such as
// "registry.io:5000/team/app", as the kubelet does: url.Parse needs a
// scheme, so one is added and cleared again.
func ParseSchemelessURL(s string) (*url.URL, error) {
	u, err := url.Parse("https://" + s)
	if err != nil {
		return nil, err
	}
	u.Scheme = ""
	return u, nil
}

// splitHost splits a URL's host into its dot-separated labels and its port.
func splitHost(u *url.URL) (labels []string, port string) {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, ""
	}
	return strings.Split(host, "."), port
}

// URLsMatch reports whether target matches glob, with the kubelet's rules
// (KEP-2133, pkg/credentialprovider/keyring.go):
//   - the ports are equal (a pattern without port matches only images
//     without port);
//   - the hosts have as many labels, and each target label matches the
//     glob's label with filepath.Match: a glob never spans two labels;
//   - the glob's path is a string prefix of the target's path (so
//     "registry.io/team" also matches "registry.io/teamwork": the kubelet
//     compares strings, not path segments).
func URLsMatch(glob, target *url.URL) (bool, error) {
	globLabels, globPort := splitHost(glob)
	targetLabels, targetPort := splitHost(target)
	if globPort != targetPort || len(globLabels) != len(targetLabels) {
		return false, nil
	}
	if !strings.HasPrefix(target.Path, glob.Path) {
		return false, nil
	}
	for i, g := range globLabels {
		ok, err := filepath.Match(g, targetLabels[i])
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// MatchImage reports whether image (a repository without tag or digest,
// as the kubelet passes it) matches pattern.
func MatchImage(pattern, image string) bool {
	g, err := ParseSchemelessURL(pattern)
	if err != nil {
		return false
	}
	t, err := ParseSchemelessURL(image)
	if err != nil {
		return false
	}
	ok, _ := URLsMatch(g, t)
	return ok
}

// ValidateMatchImage checks a matchImages entry as the kubelet does (it
// must parse as a schemeless URL) and, beyond the kubelet, that its glob
// labels are well formed, so that a pattern that could never match is an
// error at start rather than a silent miss at pull time.
func ValidateMatchImage(pattern string) error {
	u, err := ParseSchemelessURL(pattern)
	if err != nil {
		return err
	}
	labels, _ := splitHost(u)
	for _, l := range labels {
		if _, err := filepath.Match(l, ""); err != nil {
			return err
		}
	}
	return nil
}

// AuthKey normalises a key of a response's auth map (or of a docker
// config.json) the way the kubelet's keyring does: a scheme is allowed and
// dropped, and a /v1/ or /v2/ path means the whole host.
func AuthKey(k string) (string, bool) {
	v := k
	if !strings.HasPrefix(v, "https://") && !strings.HasPrefix(v, "http://") {
		v = "https://" + v
	}
	u, err := url.Parse(v)
	if err != nil {
		return "", false
	}
	p := u.Path
	if strings.HasPrefix(p, "/v2/") || strings.HasPrefix(p, "/v1/") {
		p = p[3:]
	}
	if p == "" || p == "/" {
		return u.Host, true
	}
	return u.Host + p, true
}

// IsWildcard reports whether an auth key has a glob in its host.
func IsWildcard(k string) bool { return strings.ContainsAny(k, "*?[") }
