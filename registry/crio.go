package registry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/remotes/docker"
)

// regconf is the registry check's view of CRI-O's registries.conf
// (Options.RegistriesConf): the files as last read that parsed, read again
// at the next check after they changed; and the HTTP clients made for its
// endpoints, with the TLS files of containers' certs.d.
type regconf struct {
	path      string
	certRoots []string
	log       *slog.Logger
	tune      func(*http.Transport)

	cur atomic.Pointer[registriesConf]

	mu      sync.Mutex // serializes reading the files, and guards failed and clients
	failed  string     // the fingerprint of files that did not parse (logged once)
	clients map[string]cachedClient
}

type cachedClient struct {
	fingerprint string
	host        docker.RegistryHost
}

func newRegconf(path, certsDir string, log *slog.Logger, tune func(*http.Transport)) (*regconf, error) {
	if certsDir == "" {
		certsDir = DefaultCertsDir
	}
	s := &regconf{path: path, certRoots: filepath.SplitList(certsDir), log: log, tune: tune}
	rc, err := loadRegistriesConf(path)
	if err != nil {
		return nil, err
	}
	s.cur.Store(rc)
	return s, nil
}

// current is the configuration the next check reads: the files again when
// they changed since, unless they do not parse. CRI-O too keeps serving
// with the registries it read when a reload finds the files broken; the
// operator is told, once per change, in the log (and Reload refuses them).
func (s *regconf) current() *registriesConf {
	cur := s.cur.Load()
	fp, err := registriesConfFingerprint(s.path)
	if err == nil && fp == cur.fingerprint {
		return cur
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur = s.cur.Load()
	if err != nil {
		if fp = "error: " + err.Error(); s.failed != fp {
			s.failed = fp
			s.log.Error("the node's registries configuration cannot be read: the registry check keeps the one read before", "err", err)
		}
		return cur
	}
	if fp == cur.fingerprint || fp == s.failed {
		return cur
	}
	rc, err := loadRegistriesConf(s.path)
	if err != nil {
		s.failed = fp
		s.log.Error("the node's registries configuration does not parse: the registry check keeps the one read before", "err", err)
		return cur
	}
	s.failed = ""
	s.cur.Store(rc)
	return rc
}

// reset drops the HTTP clients (their connections), for a Reload: the
// next check makes them anew from the TLS files.
func (s *regconf) reset(rc *registriesConf) {
	s.mu.Lock()
	old := s.clients
	s.clients = nil
	s.failed = ""
	s.cur.Store(rc)
	s.mu.Unlock()
	for _, c := range old {
		c.host.Client.CloseIdleConnections()
	}
}

// plan is how a check reaches a registry under an entry of registries.conf.
type plan struct {
	host       string // the host asked, as images name it ("docker.io")
	repository string // the repository there; "" for the image's own
	insecure   bool   // https unverified, then plain http
	ns         string // the entry's namespace-proxy: an "ns" query argument
	// elsewhere is the entry's location when it moves the registry to
	// another host: not asked (see regconfEndpoint).
	elsewhere string
}

// planFor decides where a check of ref (registry/repository) asks, under
// r (nil: no entry matches). The registry's own host is asked: directly,
// at a location on the same host (a namespace rewrite), or under a
// wildcard entry. A location on another host is not the registry's word:
// containers/image sends the pull's credential only to the host the image
// names (it drops it for another host, as for a mirror), so CRI-O pulls
// from there with the node's own credential or none, and a host that
// answers the node may answer anyone; the check asks the image's own host
// instead, as it skips a mirror, unless the operator vouched for it.
func planFor(r *confRegistry, registry, ref string) (plan, error) {
	p := plan{host: registry}
	if r == nil {
		return p, nil
	}
	d, repo, err := r.rewrite(ref, r.confEndpoint)
	if err != nil {
		return p, err
	}
	if d != registry {
		p.elsewhere = r.Location
		return p, nil
	}
	p.insecure, p.ns = r.Insecure, r.NamespaceProxy
	if repo != strings.TrimPrefix(ref, registry+"/") {
		p.repository = repo
	}
	return p, nil
}

// apiHost is the host a registry's API is at: Docker Hub's is not the
// name images use (containerd and containers/image agree).
func apiHost(host string) string {
	if host == "docker.io" {
		return "registry-1.docker.io"
	}
	return host
}

// regconfEndpoint is where a check of name goes when the node's runtime
// reads registries.conf: refused when the entry is blocked; the operator's
// vouched mirror; else the registry's own host (planFor). Mirrors are
// never asked.
func (c *Checker) regconfEndpoint(name imageName) (*endpoint, error) {
	rc := c.regconf.current()
	ref := name.registry + "/" + name.repository
	r := rc.find(ref)
	if r != nil && r.Blocked {
		return nil, failure(ErrDenied, "blocked by the node's registries.conf", "%s matches [[registry]] prefix %q of %s, blocked = true", ref, r.Prefix, r.file)
	}
	if v, ok := (*c.vouched.Load())[name.registry]; ok {
		return c.regconfVouched(name, ref, r, v)
	}
	p, err := planFor(r, name.registry, ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.file, err)
	}
	h, err := c.regconf.client("https", apiHost(p.host), p.host, "/v2", p.insecure)
	if err != nil {
		return nil, err
	}
	return &endpoint{registry: name.registry, host: h, crio: true, ns: p.ns, repository: p.repository}, nil
}

// regconfVouched is the endpoint of a vouched mirror. When the entry names
// its host (its location, or a mirror's), that endpoint's insecure and
// namespace-proxy apply, and its rewrite of the repository: the mirror is
// asked as the runtime would ask it.
func (c *Checker) regconfVouched(name imageName, ref string, r *confRegistry, v vouchedURL) (*endpoint, error) {
	ep := &endpoint{registry: name.registry, vouched: true, crio: true}
	insecure := false
	if r != nil {
		for _, e := range append([]confEndpoint{r.confEndpoint}, r.Mirrors...) {
			if e.Location == "" || locationHost(e.Location) != v.host {
				continue
			}
			_, repo, err := r.rewrite(ref, e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r.file, err)
			}
			if repo != name.repository {
				ep.repository = repo
			}
			insecure, ep.ns = e.Insecure, e.NamespaceProxy
			break
		}
	}
	h, err := c.regconf.client(v.scheme, v.host, v.host, v.path, insecure)
	if err != nil {
		return nil, err
	}
	ep.host = h
	return ep, nil
}

// client is the HTTP client of an endpoint, with the TLS files of
// certHost's directory in the first certs.d root that has one (as
// containers/image: ca.crt and other *.crt are CAs beside the system's,
// a *.cert with its *.key a client certificate), kept while that
// directory is unchanged. insecure, as containers/image takes it: the
// certificate is not verified, and a registry that speaks plain HTTP is
// asked over HTTP.
func (s *regconf) client(scheme, host, certHost, path string, insecure bool) (docker.RegistryHost, error) {
	dir, fp, err := s.certDir(certHost)
	if err != nil {
		return docker.RegistryHost{}, err
	}
	key := fmt.Sprintf("%s://%s%s insecure=%v", scheme, host, path, insecure)
	s.mu.Lock()
	if cc, ok := s.clients[key]; ok && cc.fingerprint == fp {
		s.mu.Unlock()
		return cc.host, nil
	}
	s.mu.Unlock()

	cfg := &tls.Config{InsecureSkipVerify: insecure}
	if dir != "" {
		if err := loadCertsDir(dir, cfg); err != nil {
			return docker.RegistryHost{}, err
		}
	}
	tr := docker.DefaultHTTPTransport(cfg)
	s.tune(tr)
	var rt http.RoundTripper = tr
	if insecure && scheme == "https" {
		rt = docker.NewHTTPFallback(tr)
	}
	h := docker.RegistryHost{
		Client: &http.Client{Transport: rt}, Scheme: scheme, Host: host, Path: path,
		Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve,
	}
	s.mu.Lock()
	old, had := s.clients[key]
	if s.clients == nil || len(s.clients) >= maxCachedRegistries {
		s.clients = map[string]cachedClient{}
	}
	s.clients[key] = cachedClient{fingerprint: fp, host: h}
	s.mu.Unlock()
	if had {
		old.host.Client.CloseIdleConnections()
	}
	return h, nil
}

// certDir is host's TLS directory, the first of the roots that has one,
// and a fingerprint of its files; "" when none has.
func (s *regconf) certDir(host string) (dir, fingerprint string, err error) {
	for _, root := range s.certRoots {
		d := filepath.Join(root, host)
		entries, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue // containers/image skips an unreadable one too
		}
		if err != nil {
			return "", "", fmt.Errorf("TLS files of %s: %w", host, err)
		}
		var b strings.Builder
		b.WriteString(d)
		for _, e := range entries {
			if info, err := e.Info(); err == nil {
				fmt.Fprintf(&b, "\x00%s\x00%d\x00%d", e.Name(), info.Size(), info.ModTime().UnixNano())
			}
		}
		return d, b.String(), nil
	}
	return "", "", nil
}

// loadCertsDir reads a containers-certs.d(5) directory into cfg: each
// *.crt is a CA, added to the system's roots; each *.cert, with the *.key
// of the same name, a client certificate. A certificate without its key,
// or a key without its certificate, is an error, as containers/image has
// it. Errors name the file, never what it holds.
func loadCertsDir(dir string, cfg *tls.Config) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("TLS files: %w", err)
	}
	has := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(dir, name)
		switch {
		case strings.HasSuffix(name, ".crt"):
			b, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("TLS files: %w", err)
			}
			if cfg.RootCAs == nil {
				if cfg.RootCAs, err = x509.SystemCertPool(); err != nil {
					return fmt.Errorf("TLS files of %s: the system's roots: %w", dir, err)
				}
			}
			// A file with no PEM certificate adds none, and is no error:
			// containers/image takes it so.
			cfg.RootCAs.AppendCertsFromPEM(b)
		case strings.HasSuffix(name, ".cert"):
			key := strings.TrimSuffix(name, ".cert") + ".key"
			if !has(key) {
				return fmt.Errorf("TLS files: client certificate %s has no key %s (a CA's file ends in .crt)", p, key)
			}
			pair, err := tls.LoadX509KeyPair(p, filepath.Join(dir, key))
			if err != nil {
				return fmt.Errorf("TLS files: client certificate %s and key %s: %w", p, key, err)
			}
			cfg.Certificates = append(cfg.Certificates, pair)
		case strings.HasSuffix(name, ".key"):
			if cert := strings.TrimSuffix(name, ".key") + ".cert"; !has(cert) {
				return fmt.Errorf("TLS files: key %s has no client certificate %s", p, cert)
			}
		}
	}
	return nil
}
