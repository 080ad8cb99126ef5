package registry

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/distribution/reference"
	"github.com/sirupsen/logrus"
)

// DefaultHostsDir is containerd 2's default config_path: the directories
// searched, in order, for <host>/hosts.toml.
const DefaultHostsDir = "/etc/containerd/certs.d:/etc/docker/certs.d"

// VouchedMirror is a mirror the operator vouches for: it enforces the
// registry's own authorization (it passes each caller's credential on, or
// checks it the way the registry would), so its answer counts as the
// registry's. Checks for Registry go to Endpoint instead of the registry's
// server.
type VouchedMirror struct {
	// Registry is the registry host as images name it: "docker.io",
	// "registry.example:5000".
	Registry string
	// Endpoint is the mirror's URL, "https://mirror.example"; "/v2" is
	// added to its path unless the path ends with it. When a [host] entry
	// of the registry's hosts.toml names the same host and path, that
	// entry's TLS settings and headers are used; otherwise the system's
	// roots.
	Endpoint string
}

// endpoint is where a check asks, and how.
type endpoint struct {
	registry string
	host     docker.RegistryHost
	vouched  bool
	// crio: the endpoint comes from registries.conf, whose runtime adds
	// an "ns" query argument only where an entry's namespace-proxy says
	// so (ns).
	crio bool
	ns   string
	// repository is the image's repository at this endpoint when a
	// registries.conf location rewrites it ("" for the image's own).
	repository string
}

func (e *endpoint) String() string { return e.host.Scheme + "://" + e.host.Host + e.host.Path }

// label is the endpoint as the metrics name it: scheme and host.
func (e *endpoint) label() string { return e.host.Scheme + "://" + e.host.Host }

// namespace is the "ns" query argument containerd adds when the host asked
// is not the registry the image names (a mirror, or a server elsewhere), so
// that the requests are the runtime's own.
func (e *endpoint) namespace() string {
	if e.crio {
		return e.ns
	}
	if e.host.Host == e.registry || (e.registry == "docker.io" && e.host.Host == "registry-1.docker.io") {
		return ""
	}
	return e.registry
}

// vouchedURL is a VouchedMirror's endpoint, parsed.
type vouchedURL struct {
	scheme, host string
	path         string // the API root: ends with /v2
	given        string // the path as given, cleaned (matches an override_path entry)
}

// parseVouched validates the operator's mirrors; the result is keyed by
// normalized registry host.
func parseVouched(mirrors []VouchedMirror) (map[string]vouchedURL, error) {
	out := make(map[string]vouchedURL, len(mirrors))
	var errs []error
	for i, m := range mirrors {
		reg, err := normalizeRegistry(m.Registry)
		if err != nil {
			errs = append(errs, fmt.Errorf("vouched mirror %d: registry: %w", i, err))
			continue
		}
		v, err := parseEndpointURL(m.Endpoint)
		if err != nil {
			errs = append(errs, fmt.Errorf("vouched mirror %d (%s): endpoint: %w", i, reg, err))
			continue
		}
		if _, dup := out[reg]; dup {
			errs = append(errs, fmt.Errorf("vouched mirror %d: registry %s named twice", i, reg))
			continue
		}
		out[reg] = v
	}
	return out, errors.Join(errs...)
}

// normalizeRegistry returns a registry host as references name it.
func normalizeRegistry(s string) (string, error) {
	if s == "" || strings.ContainsAny(s, "/@ ") {
		return "", fmt.Errorf("%q is not a registry host", s)
	}
	named, err := reference.ParseNormalizedNamed(s + "/x")
	if err != nil {
		return "", fmt.Errorf("%q is not a registry host: %v", s, err)
	}
	d := reference.Domain(named)
	if d != s && !(s == "index.docker.io" && d == "docker.io") {
		return "", fmt.Errorf("%q is not a registry host (a name without a dot, a colon or \"localhost\" is a Docker Hub path)", s)
	}
	return d, nil
}

func parseEndpointURL(s string) (vouchedURL, error) {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return vouchedURL{}, fmt.Errorf("a URL that does not parse: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return vouchedURL{}, fmt.Errorf("%q: the scheme must be http or https", u.Redacted())
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return vouchedURL{}, fmt.Errorf("%q: want scheme://host[:port][/path], no user, query or fragment", u.Redacted())
	}
	v := vouchedURL{scheme: u.Scheme, host: u.Host, path: "/v2"}
	if p := path.Clean("/" + u.Path); p != "/" {
		v.given, v.path = p, p
		if !strings.HasSuffix(p, "/v2") {
			v.path = p + "/v2"
		}
	}
	return v, nil
}

// RedactURL is s for a log or an error: a password in it masked, and a
// string that does not parse as a URL not shown at all.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return strconv.Quote(u.Redacted())
}

// hostsCache keeps what containerd's ConfigureHosts made of a registry's
// hosts directory, and so its connection pools, while the directory is
// unchanged: hosts.toml's content and the directory's entries (names,
// sizes, times) are compared at every check, as containerd reads the
// directory at every pull. A CA or client certificate referenced from
// outside the directory is read again when hosts.toml changes or after
// Reload.
type hostsCache struct {
	mu sync.Mutex
	m  map[string]cachedHosts
}

type cachedHosts struct {
	fingerprint string
	hosts       []docker.RegistryHost
}

const maxCachedRegistries = 256

func (c *Checker) registryHosts(ctx context.Context, registry string) ([]docker.RegistryHost, error) {
	fp, err := c.hostsFingerprint(registry)
	if err != nil {
		return nil, err
	}
	c.hosts.mu.Lock()
	if e, ok := c.hosts.m[registry]; ok && e.fingerprint == fp {
		c.hosts.mu.Unlock()
		return e.hosts, nil
	}
	c.hosts.mu.Unlock()

	// containerd's code logs through logrus (a hosts.toml it cannot decode,
	// https tried first at a localhost port): not on the daemon's stderr.
	ctx = log.WithLogger(ctx, quietLogger)
	hosts, err := config.ConfigureHosts(ctx, config.HostOptions{
		HostDir:      c.hostDir,
		UpdateClient: c.tuneClient,
	})(registry)
	if err != nil {
		return nil, fmt.Errorf("hosts configuration of %s: %w", registry, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("hosts configuration of %s names no endpoint", registry)
	}

	c.hosts.mu.Lock()
	old, had := c.hosts.m[registry]
	if c.hosts.m == nil || len(c.hosts.m) >= maxCachedRegistries {
		c.hosts.m = map[string]cachedHosts{}
	}
	c.hosts.m[registry] = cachedHosts{fingerprint: fp, hosts: hosts}
	c.hosts.mu.Unlock()
	if had {
		for _, h := range old.hosts {
			h.Client.CloseIdleConnections()
		}
	}
	return hosts, nil
}

var quietLogger = func() *log.Entry {
	l := logrus.New()
	l.Out = io.Discard
	return logrus.NewEntry(l)
}()

// tuneClient keeps enough idle connections for a check's parallel HEADs.
func (c *Checker) tuneClient(cl *http.Client) error {
	if t, ok := cl.Transport.(*http.Transport); ok {
		t.MaxIdleConnsPerHost = c.maxParallel + 1
	}
	return nil
}

// hostsFingerprint identifies the state of a registry's hosts directory.
func (c *Checker) hostsFingerprint(registry string) (string, error) {
	dir, err := c.hostDir(registry)
	if err != nil && !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("hosts directory of %s: %w", registry, err)
	}
	if dir == "" {
		return "", nil
	}
	h := sha256.New()
	h.Write([]byte(dir))
	h.Write([]byte{0})
	b, err := os.ReadFile(filepath.Join(dir, "hosts.toml"))
	if err != nil && !os.IsNotExist(err) {
		return "", fmt.Errorf("hosts directory of %s: %w", registry, err)
	}
	h.Write(b)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("hosts directory of %s: %w", registry, err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue // gone since the listing: the next check sees the change
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00%d", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hostDirFromRoots searches each root in turn, as containerd's CRI does
// with a config_path of several directories.
func hostDirFromRoots(roots []string) func(string) (string, error) {
	fns := make([]func(string) (string, error), len(roots))
	for i, r := range roots {
		fns[i] = config.HostDirFromRoot(r)
	}
	return func(host string) (dir string, err error) {
		for _, fn := range fns {
			dir, err = fn(host)
			if (err != nil && !errdefs.IsNotFound(err)) || dir != "" {
				return dir, err
			}
		}
		return "", errdefs.ErrNotFound
	}
}

// endpointFor is where a check for registry goes: the operator's vouched
// mirror for it, else the server of its hosts.toml (containerd lists the
// server last, after every [host] mirror; the mirrors are never asked).
func (c *Checker) endpointFor(ctx context.Context, registry string) (*endpoint, error) {
	hosts, err := c.registryHosts(ctx, registry)
	if err != nil {
		return nil, err
	}
	v, ok := (*c.vouched.Load())[registry]
	if !ok {
		return &endpoint{registry: registry, host: hosts[len(hosts)-1]}, nil
	}
	for _, h := range hosts {
		if h.Host == v.host && (h.Path == v.path || (v.given != "" && h.Path == v.given)) {
			return &endpoint{registry: registry, host: h, vouched: true}, nil
		}
	}
	return &endpoint{registry: registry, vouched: true, host: docker.RegistryHost{
		Client: c.vouchedClient, Scheme: v.scheme, Host: v.host, Path: v.path,
	}}, nil
}

func newVouchedClient(c *Checker) *http.Client {
	cl := &http.Client{Transport: docker.DefaultHTTPTransport(&tls.Config{})}
	c.tuneClient(cl)
	return cl
}
