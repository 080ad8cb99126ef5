package keyring

import (
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// Matching as the runtime reaches a registry, for image policy.
//
// The kubelet matches credential providers' matchImages (URLsMatch) by
// the letter: host labels compared case-sensitively, and a port only
// equal to the same port. For credentials that fails closed: a spelling
// it does not match gets no credential, and a private image's pull fails.
// For an image policy it would fail open: REGISTRY.EXAMPLE.COM/app and
// registry.example.com:443/app reach the server registry.example.com/app
// does, the runtime pulls them, and a policy missing them lets them run.
// So image policy compares hosts as the runtime reaches them:
//   - a host name case-folded (DNS names are case-insensitive), an IP
//     literal in its canonical form ([0:0::1] is [::1]; an IPv4-mapped
//     IPv6 address is its IPv4 address), a port without leading zeros;
//   - a port of 443 or 80 is the same as none, as https's and plain
//     http's default port. The proxy does not know which scheme the runtime
//     uses for a host (hosts.toml may say either, and may change), so
//     both are taken: "h" matches "h:443" (https) and "h:80" (http), and
//     "h:443" never matches "h:80" (no scheme makes both the default). A
//     host that serves https on port 80 is thereby covered by a pattern
//     for the host: a policy applies to more images, never fewer;
//   - any other port must be equal, as in the kubelet; host label globs
//     and the path prefix are the kubelet's.
//
// Credential providers keep URLsMatch, the kubelet's rule.

// defaultPorts are the ports a host named without one may be reached on:
// https's and plain http's.
var defaultPorts = [...]string{"443", "80"}

// reachedHost is a host as the runtime reaches it.
type reachedHost struct {
	labels []string // case-folded, or an IP's canonical form as one label
	port   string   // "" for none, else decimal without leading zeros
}

// parseReachedHost splits host[:port] (as a URL's Host: an IPv6 literal
// in brackets) into a reachedHost.
func parseReachedHost(hostport string) reachedHost {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, ""
	}
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			port = strconv.FormatUint(n, 10)
		}
	}
	if addr, err := netip.ParseAddr(host); err == nil && addr.Zone() == "" {
		addr = addr.Unmap()
		if addr.Is4() {
			return reachedHost{labels: strings.Split(addr.String(), "."), port: port}
		}
		return reachedHost{labels: []string{addr.String()}, port: port}
	}
	return reachedHost{labels: strings.Split(strings.ToLower(host), "."), port: port}
}

// portsReachSame reports whether a pattern's port and a target's reach the
// same server under some scheme: equal, or one absent and the other that
// scheme's default.
func portsReachSame(pattern, target string) bool {
	if pattern == target {
		return true
	}
	for _, d := range defaultPorts {
		if (pattern == "" && target == d) || (target == "" && pattern == d) {
			return true
		}
	}
	return false
}

// ReachedPattern is a matchImages pattern (the kubelet's syntax) matched as
// the runtime reaches registries: see above. Image policy's rule, not the
// credential providers'.
type ReachedPattern struct {
	host reachedHost
	path string
}

// ParseReachedPattern parses a matchImages pattern; ValidateMatchImage
// tells what is wrong with one that does not parse.
func ParseReachedPattern(pattern string) (ReachedPattern, error) {
	if err := ValidateMatchImage(pattern); err != nil {
		return ReachedPattern{}, err
	}
	u, err := ParseSchemelessURL(pattern)
	if err != nil {
		return ReachedPattern{}, err
	}
	return ReachedPattern{host: parseReachedHost(u.Host), path: u.Path}, nil
}

// Repository is a repository parsed for ReachedPattern.Match.
type Repository struct {
	host reachedHost
	path string
	ok   bool
}

// ParseRepository parses a repository ("registry.example.com:443/team/app",
// no tag or digest); false for one that does not parse, which matches no
// pattern.
func ParseRepository(repo string) (Repository, bool) {
	u, err := ParseSchemelessURL(repo)
	if err != nil {
		return Repository{}, false
	}
	return Repository{host: parseReachedHost(u.Host), path: u.Path, ok: true}, true
}

// Match reports whether repo matches the pattern: the hosts reach the same
// server (labels equal case-folded or by the pattern's glob, one label per
// glob; ports as above), and the pattern's path is a string prefix of the
// repository's, as in the kubelet.
func (p ReachedPattern) Match(repo Repository) bool {
	if !repo.ok || !portsReachSame(p.host.port, repo.host.port) || len(p.host.labels) != len(repo.host.labels) {
		return false
	}
	if !strings.HasPrefix(repo.path, p.path) {
		return false
	}
	for i, g := range p.host.labels {
		if ok, err := filepath.Match(g, repo.host.labels[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// MatchImageAsReached reports whether repository (no tag or digest)
// matches pattern as the runtime reaches registries.
func MatchImageAsReached(pattern, repository string) bool {
	p, err := ParseReachedPattern(pattern)
	if err != nil {
		return false
	}
	repo, _ := ParseRepository(repository)
	return p.Match(repo)
}

// SameHost reports whether two hosts (host[:port], as image references
// name registries) reach the same server as above: what a host-keyed
// setting found under one spelling means for another.
func SameHost(a, b string) bool {
	ha, hb := parseReachedHost(a), parseReachedHost(b)
	if !portsReachSame(ha.port, hb.port) || len(ha.labels) != len(hb.labels) {
		return false
	}
	for i := range ha.labels {
		if ha.labels[i] != hb.labels[i] {
			return false
		}
	}
	return true
}

// CanonicalRepository is repo with its host in the form every spelling of
// it shares: the name case-folded, an IP literal canonical, the port
// without leading zeros. The port is kept (443 or 80 may be a port of its
// own): "REGISTRY.Example.com:0443/team/app" is
// "registry.example.com:443/team/app". A repository that does not parse
// is returned as it is.
func CanonicalRepository(repo string) string {
	hostport, path, hasPath := strings.Cut(repo, "/")
	if u, err := ParseSchemelessURL(repo); err != nil || u.Host != hostport || hostport == "" {
		return repo
	}
	h := parseReachedHost(hostport)
	host := strings.Join(h.labels, ".")
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if h.port != "" {
		host += ":" + h.port
	}
	if host == hostport {
		return repo
	}
	if !hasPath {
		return host
	}
	return host + "/" + path
}
