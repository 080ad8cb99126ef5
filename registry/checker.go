package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/prometheus/client_golang/prometheus"
)

// The bounds a Checker takes when Options leave them zero.
const (
	DefaultTimeout          = 10 * time.Second
	DefaultProofTimeout     = 10 * time.Minute
	DefaultMaxProofBytes    = 8 << 30
	DefaultMaxProofParallel = 3
	// DefaultProofInflation is how many times the compressed bound a
	// layer may decompress to when Options leave the decompressed bound
	// zero. Real layers compress 2 to 5 times (a base OS layer about 3,
	// binaries and model weights about 1); the bound is each layer's, so
	// a layer far smaller than the compressed bound may inflate further.
	// It stops a decompression bomb (a small blob inflating to terabytes)
	// after a minute or two of a core (which decompresses and hashes 300
	// to 400 MB/s), not at the proof's timeout.
	DefaultProofInflation = 4
)

// DefaultMaxProofUncompressed is the decompressed bound a Checker takes
// for a compressed bound of maxProofBytes when Options leave it zero:
// DefaultProofInflation times maxProofBytes, saturating.
func DefaultMaxProofUncompressed(maxProofBytes int64) int64 {
	if maxProofBytes > math.MaxInt64/DefaultProofInflation {
		return math.MaxInt64
	}
	return DefaultProofInflation * maxProofBytes
}

// Options configure a Checker. The zero value is usable.
type Options struct {
	// HostsDir is containerd's config_path: the certs.d directories, ':'
	// separated, where <host>/hosts.toml is read. "" is DefaultHostsDir.
	// Not read with RegistriesConf.
	HostsDir string
	// RegistriesConf, when set, is CRI-O's containers-registries.conf: the
	// check reads it and the *.conf files of RegistriesConf+".d" instead of
	// hosts.toml files (DefaultRegistriesConf is where CRI-O has it). A
	// missing file is an empty configuration, as for CRI-O.
	RegistriesConf string
	// CertsDir are the containers-certs.d directories, ':' separated,
	// where <host[:port]>/ holds a registry's TLS files, read with
	// RegistriesConf. "" is DefaultCertsDir.
	CertsDir string
	// Vouched names mirrors the operator vouches for; see VouchedMirror.
	Vouched []VouchedMirror
	// Timeout bounds each question a check asks a registry (the
	// reference's resolution, a round of blob requests); 0 is
	// DefaultTimeout.
	Timeout time.Duration
	// MaxParallel bounds the HEAD requests one check has in flight; 0 is 8.
	MaxParallel int
	// ManifestCacheBytes bounds the manifests kept in memory (verified by
	// digest); 0 is 8 MiB, negative keeps none.
	ManifestCacheBytes int64
	// ProofTimeout bounds the proof of a pull's layers by their bytes
	// (Request.ProveLayers); 0 is DefaultProofTimeout.
	ProofTimeout time.Duration
	// MaxProofBytes bounds each layer a proof fetches, compressed; 0 is
	// DefaultMaxProofBytes (8 GiB). A layer over it cannot be proven: the
	// pull is refused.
	MaxProofBytes int64
	// MaxProofUncompressedBytes bounds what each layer a proof fetches
	// decompresses to; 0 is DefaultMaxProofUncompressed(MaxProofBytes),
	// 32 GiB by default. A layer over it cannot be proven: the pull is
	// refused. (A zstd frame's window is bounded too, to 128 MiB: see
	// maxZstdWindow.)
	MaxProofUncompressedBytes int64
	// MaxProofParallel bounds the layers one proof fetches at once; 0 is
	// DefaultMaxProofParallel, containerd's default for a pull's layer
	// downloads.
	MaxProofParallel int
	// Registerer takes the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger gets one debug line per check; nil discards.
	Logger *slog.Logger
}

// Checker asks registries whether a credential can read an image. Safe for
// concurrent use; Reload may run alongside checks.
type Checker struct {
	hostDir          func(string) (string, error)
	hostRoots        []string // HostsDir, split
	timeout          time.Duration
	maxParallel      int
	proofTimeout     time.Duration
	maxProofBytes    int64
	maxUncompressed  int64 // a proven layer's decompressed bytes
	maxProofParallel int
	log              *slog.Logger
	metrics          *metrics
	labels           *labelSet

	// regconf is CRI-O's registries.conf (Options.RegistriesConf); nil:
	// containerd's hosts.toml files (hostDir, hosts).
	regconf *regconf

	vouched       atomic.Pointer[map[string]vouchedURL]
	vouchedClient *http.Client
	hosts         hostsCache
	challenges    challengeMemory
	manifests     *manifestCache
	tags          tagMemory
	inflations    inflationMemory // layers proven by decompression
}

// New validates opts and returns a Checker.
func New(opts Options) (*Checker, error) {
	c := &Checker{timeout: opts.Timeout, maxParallel: opts.MaxParallel, log: opts.Logger,
		proofTimeout: opts.ProofTimeout, maxProofBytes: opts.MaxProofBytes, maxProofParallel: opts.MaxProofParallel}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxParallel <= 0 {
		c.maxParallel = 8
	}
	if c.proofTimeout <= 0 {
		c.proofTimeout = DefaultProofTimeout
	}
	if c.maxProofBytes <= 0 {
		c.maxProofBytes = DefaultMaxProofBytes
	}
	c.maxUncompressed = opts.MaxProofUncompressedBytes
	if c.maxUncompressed <= 0 {
		c.maxUncompressed = DefaultMaxProofUncompressed(c.maxProofBytes)
	}
	if c.maxProofParallel <= 0 {
		c.maxProofParallel = DefaultMaxProofParallel
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	dirs := opts.HostsDir
	if dirs == "" {
		dirs = DefaultHostsDir
	}
	c.hostRoots = filepath.SplitList(dirs)
	c.hostDir = hostDirFromRoots(c.hostRoots)
	cacheBytes := opts.ManifestCacheBytes
	if cacheBytes == 0 {
		cacheBytes = 8 << 20
	}
	c.manifests = newManifestCache(max(cacheBytes, 0))
	c.vouchedClient = newVouchedClient(c)
	c.labels = newLabelSet(maxLabelledHosts)
	if opts.RegistriesConf != "" {
		rc, err := newRegconf(opts.RegistriesConf, opts.CertsDir, c.log, func(t *http.Transport) { t.MaxIdleConnsPerHost = c.maxParallel + 1 })
		if err != nil {
			return nil, err
		}
		c.regconf = rc
	}
	if err := c.Reload(opts.Vouched); err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("registry metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// ValidateVouched checks vouched-for mirrors as Reload and New take them.
func ValidateVouched(vouched []VouchedMirror) error {
	_, err := parseVouched(vouched)
	return err
}

// Reload validates vouched and reads the node's registries.conf again
// (with Options.RegistriesConf) and, when both are valid, makes them the
// vouched mirrors and registries of the checks that start from now on
// (atomically), and has the next check of every registry read its hosts
// configuration and TLS files afresh. On an error nothing changes.
func (c *Checker) Reload(vouched []VouchedMirror) error {
	p, err := c.PrepareReload(vouched)
	if err != nil {
		return err
	}
	c.ApplyReload(p)
	return nil
}

// Reloading is a configuration PrepareReload read and validated, for
// ApplyReload: a caller that swaps several components checks every one
// before it changes any.
type Reloading struct {
	vouched map[string]vouchedURL
	regconf *registriesConf
}

// PrepareReload is Reload's reading and validation, with no change: an
// error names what is wrong (a vouched mirror, or the registries.conf
// file and what it holds).
func (c *Checker) PrepareReload(vouched []VouchedMirror) (*Reloading, error) {
	v, err := parseVouched(vouched)
	if err != nil {
		return nil, err
	}
	p := &Reloading{vouched: v}
	if c.regconf != nil {
		if p.regconf, err = loadRegistriesConf(c.regconf.path); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ApplyReload makes p the configuration of the checks that start from now
// on.
func (c *Checker) ApplyReload(p *Reloading) {
	c.vouched.Store(&p.vouched)
	hosts := make([]string, 0, len(p.vouched))
	for r := range p.vouched {
		hosts = append(hosts, r)
	}
	c.labels.setFixed(hosts)
	if c.regconf != nil {
		c.regconf.reset(p.regconf)
	}
	c.hosts.mu.Lock()
	old := c.hosts.m
	c.hosts.m = nil
	c.hosts.mu.Unlock()
	for _, e := range old {
		for _, h := range e.hosts {
			h.Client.CloseIdleConnections()
		}
	}
}

// Check asks the image's registry (or the mirror vouched for it) whether
// r.Credential can read r.Image, and whether it is the image r.ImageID. A
// nil error means verified. Otherwise the error matches ErrDenied, ErrMoved
// or ErrUnreachable (errors.Is), or none of them for a Request that is not
// valid (an image that does not parse, an invalid ImageID); it is an
// *Error in the first three cases.
func (c *Checker) Check(ctx context.Context, r Request) (res Result, err error) {
	start := time.Now()
	res.CredentialKind = r.Credential.Kind()
	name, err := parseImage(r.Image)
	if err != nil {
		c.metrics.checks.WithLabelValues(otherHost, "", resultInvalid).Inc()
		return res, err
	}
	imageID, err := parseImageID(r.ImageID)
	if err != nil {
		c.metrics.checks.WithLabelValues(c.labels.registry(name.registry), "", resultInvalid).Inc()
		return res, err
	}
	platform := platforms.DefaultSpec()
	if r.Platform != nil {
		platform = *r.Platform
	}
	res.Registry, res.Repository = name.registry, name.repository

	// Each phase that asks the registry is bounded by c.timeout (run,
	// runBeside); the rest (waiting for the runtime's pull, a layer's
	// proof, with its own bound) by the caller's context.
	// containerd's authorizer logs through logrus: keep it off stderr.
	ctx = log.WithLogger(ctx, quietLogger)
	chk := &check{c: c, name: name, cred: r.Credential, res: &res}
	defer func() { c.report(ctx, r, chk, err, time.Since(start)) }()

	ep, err := c.endpointOf(ctx, name)
	if err != nil {
		return res, err
	}
	res.Endpoint, res.Vouched = ep.String(), ep.vouched
	if ep.repository != "" {
		// A registries.conf location on the registry's host moves the
		// repository: the check asks for it where the runtime pulls it.
		chk.name.repository = ep.repository
	}
	chk.start(ctx, ep)
	if r.Beside != nil && r.Blobs {
		return res, chk.runBeside(ctx, platform, r)
	}
	return res, chk.run(ctx, imageID, platform, r.Blobs, r.ProveLayers)
}

// report ends a check: its result counted (the checks metric), said in
// the debug log, and, for a forgery, warned of; an *Error learns the
// endpoint it was had from.
func (c *Checker) report(ctx context.Context, r Request, chk *check, err error, took time.Duration) {
	res := chk.res
	res.Requests, res.ManifestGets = int(chk.requests.Load()), int(chk.manifestGets.Load())
	result := resultVerified
	switch {
	case errors.Is(err, ErrForged):
		result = resultForged
	case errors.Is(err, ErrDenied):
		result = resultDenied
	case errors.Is(err, ErrMoved):
		result = resultMoved
	case err != nil:
		result = resultUnreachable
	}
	var e *Error
	if errors.As(err, &e) && e.Endpoint == "" {
		e.Endpoint = res.Endpoint
	}
	c.metrics.checks.WithLabelValues(c.labels.registry(chk.name.registry), c.labels.endpoint(chk.ep), result).Inc()
	c.log.LogAttrs(ctx, slog.LevelDebug, "registry check",
		slog.String("image", r.Image), slog.String("endpoint", res.Endpoint), slog.Bool("vouched", res.Vouched),
		slog.String("credential", res.CredentialKind), slog.String("result", result),
		slog.String("manifest", string(res.ManifestDigest)), slog.Int("blobsChecked", res.BlobsChecked),
		slog.Int("requests", res.Requests), slog.Duration("duration", took), errAttr(err))
	if result == resultForged {
		// Whoever called, the operator hears of it: a registry serving
		// bytes that are not the content it names is a tenant naming an
		// image it does not hold, or a corrupt storage. The error names
		// the registry, the repository and the digests.
		c.log.LogAttrs(ctx, slog.LevelWarn, "registry check: the registry served bytes that are not the content their digest names; the pull is refused",
			slog.String("image", r.Image), slog.String("registry", res.Registry), slog.String("repository", res.Repository),
			slog.String("endpoint", res.Endpoint), errAttr(err))
	}
}

// endpointOf is where the check of name asks: registries.conf's location
// for it, or its hosts.toml's server (resolved within the check's
// timeout). A configuration that blocks the registry answers with its own
// *Error; any other failure is ErrUnreachable.
func (c *Checker) endpointOf(ctx context.Context, name imageName) (*endpoint, error) {
	var ep *endpoint
	var err error
	if c.regconf != nil {
		ep, err = c.regconfEndpoint(name)
	} else {
		ectx, cancel := context.WithTimeout(ctx, c.timeout)
		ep, err = c.endpointFor(ectx, name.registry)
		cancel()
	}
	if e := (*Error)(nil); errors.As(err, &e) {
		return nil, e // the configuration's own answer: a blocked registry
	}
	if err != nil {
		return nil, failure(ErrUnreachable, "registry configuration", "%s", sanitize(err))
	}
	return ep, nil
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}
