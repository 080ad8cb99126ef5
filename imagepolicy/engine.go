package imagepolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// The wire types a Subject is made of.
type (
	Call       = policyapi.Call
	Pod        = policyapi.Pod
	Platform   = policyapi.Platform
	Credential = policyapi.Credential
)

// The calls a decision is made at.
const (
	CallPullImage       = policyapi.CallPullImage
	CallCreateContainer = policyapi.CallCreateContainer
	CallImageVolume     = policyapi.CallImageVolume
)

// Subject is what a decision is about: an image, where and for whom.
type Subject struct {
	// Call is where the proxy asks.
	Call Call
	// Image is the image as the CRI request names it (a reference, an
	// image ID or a prefix of one): for the plugin and the log.
	Image string
	// Repository is the normalized repository the image is known under
	// ("registry.test/team/app"); it selects the providers by matchImages.
	// Empty when the image is known by ID only: then every provider of the
	// namespace applies. The engine never derives it from Image: a short
	// hex string may be a name or an ID prefix.
	Repository string
	// Digest is the manifest digest: at PullImage, the one resolved at the
	// registry that the pull is pinned to; at create, the runtime's repo
	// digest for Repository, when it has one.
	Digest string
	// ImageID is the image's ID, when known (always at create).
	ImageID string
	// Platform is the platform pulled and run; nil: not said.
	Platform *Platform
	// Pod is the pod; an empty namespace is the configuration's
	// defaultNamespace (crictl, bake jobs).
	Pod Pod
	// Credential is the pull's registry credential, given only to
	// providers with sendCredentials; nil: none (anonymous, or at create).
	Credential *Credential
}

// ErrInvalidSubject marks a subject the engine cannot decide on: a
// programming error of the caller; the verdict that comes with it refuses.
var ErrInvalidSubject = errors.New("image policy: invalid subject")

func (s *Subject) validate() error {
	switch s.Call {
	case CallPullImage, CallCreateContainer, CallImageVolume:
	default:
		return fmt.Errorf("%w: call %q", ErrInvalidSubject, s.Call)
	}
	if s.Image == "" {
		return fmt.Errorf("%w: no image", ErrInvalidSubject)
	}
	return nil
}

// validateIdentity checks that a subject a provider applies to says which
// image it is: a plugin decides on a digest or an image ID. A subject no
// provider applies to is decided by its namespace's no-match policy
// without either (a pull no registry was asked about).
func (s *Subject) validateIdentity() error {
	if s.Digest == "" && s.ImageID == "" {
		return fmt.Errorf("%w: image %s has neither a digest nor an image ID", ErrInvalidSubject, s.Image)
	}
	return nil
}

// cacheKeys are the keys a subject's verdicts are cached under: the image
// ID (what a container runs) and the manifest digest (what a pull names),
// each as the repository names it. The cache key is (digest,
// provider, namespace); the repository is in it too because a plugin may
// decide per repository (the reference plugin's policies do): a verdict
// for one repository's copy of a digest is not the other's.
func (s *Subject) cacheKeys() []string {
	keys := make([]string, 0, 2)
	if s.ImageID != "" {
		keys = append(keys, cacheKey(s.Repository, s.ImageID))
	}
	if s.Digest != "" && s.Digest != s.ImageID {
		keys = append(keys, cacheKey(s.Repository, s.Digest))
	}
	return keys
}

// cacheKey is the cache key of an image ID or digest as repo names it;
// repo is "" for an image known by ID only.
func cacheKey(repo, id string) string { return repo + "@" + id }

// Decision is one provider's part of a verdict.
type Decision struct {
	Provider  string `json:"provider"`
	Allowed   bool   `json:"allowed"`
	Reason    string `json:"reason,omitempty"`
	PodReason string `json:"podReason,omitempty"`
	// FromCache is true when the verdict came from the cache.
	FromCache bool `json:"fromCache"`
	// Fault is why the plugin gave no verdict (a crash, a hang, garbage,
	// another version); Allowed then follows FailurePolicy.
	Fault         string        `json:"fault,omitempty"`
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`
	// CachedUntil is when the verdict leaves the cache; zero: not cached.
	CachedUntil time.Time `json:"cachedUntil,omitzero"`

	// epoch is the provider's files' epoch the plugin ran under: a verdict
	// made before a watched file changed is not cached, nor bound.
	epoch uint64
}

// result is the decision's metric result.
func (d *Decision) result() string {
	switch {
	case d.Fault != "" && d.Allowed:
		return resultFailedOpen
	case d.Fault != "":
		return resultFailedClosed
	case d.Allowed:
		return resultAllowed
	}
	return resultDenied
}

// Verdict is the engine's answer for a subject.
type Verdict struct {
	// Allowed: every provider that applies allowed it (or none applies).
	Allowed bool
	// Namespace the verdict is for: the pod's, or the default.
	Namespace string
	// PodReason is for the pod: the refusing provider's short reason.
	PodReason string
	// Decisions of the providers that applied, in order, up to the first
	// refusal.
	Decisions []Decision
	// NoMatchPolicy is the namespace's, when no provider applied: it made
	// the verdict.
	NoMatchPolicy NoMatchPolicy

	generation uint64 // the configuration it was made under, for Bind
	repository string // the subject's, for Reason
	invalid    error  // why the subject could not be decided on
}

// ErrDenied marks a refusal; it is a PermissionDenied (errdefs), so the
// edge maps it to codes.PermissionDenied.
var ErrDenied = fmt.Errorf("refused by image policy: %w", errdefs.ErrPermissionDenied)

// Err is nil for an allowed verdict, else an error wrapping ErrDenied
// whose message is the pod's reason: what the client (the kubelet) shows
// in the pod's status.
func (v Verdict) Err() error {
	if v.Allowed {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrDenied, v.PodReason)
}

// Options configure an Engine. The zero value is usable.
type Options struct {
	// CacheSize bounds each provider's cache; 0 means authcache's default.
	CacheSize int
	// Clock drives the caches; nil means the real clock.
	Clock clock.WithTicker
	// Logger receives decisions (debug), refusals (info) and plugin faults
	// (warn); nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
}

// Engine decides image policy for the proxy. It is safe for concurrent
// use. Its configuration can be replaced while it serves (Reload): a
// decision uses the providers current when it starts.
type Engine struct {
	host    *execplugin.Host[*providerSet, *provider]
	gen     atomic.Uint64
	metrics *metrics
	log     *slog.Logger
}

// providerSet is one configuration's providers, with fresh caches.
type providerSet struct {
	config     *Config
	generation uint64
	providers  []*provider
	byName     map[string]*provider
	repos      sync.Map // repository -> *repoInfo, see repo
	remembered atomic.Int64
}

func (set *providerSet) ConfigHash() string   { return set.config.Hash }
func (set *providerSet) Members() []*provider { return set.providers }

// provider is one configured plugin with its cache of verdicts, keyed by
// (image ID or digest as the repository names it, namespace), always with
// authcache's Image key type: a verdict is for what it was asked about,
// never for a whole registry.
type provider struct {
	*execplugin.Plugin[policyapi.ImagePolicyRequest, *policyapi.ImagePolicyResponse, Decision]
	cfg   Provider
	match matcher

	// watch is the state of the plugin's watchFiles.
	watch *fileWatch
	// epoch counts the changes of the plugin's files; storeMu orders a
	// change's drop of the cache against the storing of a verdict, so that
	// no verdict made before a change is stored after it.
	epoch   atomic.Uint64
	storeMu sync.Mutex
}

// New returns an Engine for a loaded configuration.
func New(cfg *Config, opts Options) (*Engine, error) {
	if cfg == nil {
		return nil, errors.New("image policy: no configuration")
	}
	host, err := execplugin.NewHost[*providerSet, *provider](kind, execplugin.Options{
		CacheSize: opts.CacheSize, Clock: opts.Clock, Logger: opts.Logger, Registerer: opts.Registerer,
	})
	if err != nil {
		return nil, err
	}
	e := &Engine{host: host, log: host.Log()}
	if e.metrics, err = newMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	e.host.Install(e.build(cfg))
	return e, nil
}

// Reload replaces the configuration. Every cached verdict is dropped,
// even an unchanged provider's (unlike credential providers, whose cached
// credentials a reload keeps while the provider is the same): a plugin's
// own files not in its watchFiles (a policy, its keys) are seen by no one
// else, so a reload (SIGHUP) is how a changed policy takes effect at once.
// Decisions running finish under the configuration they started with;
// what they cache goes with it.
func (e *Engine) Reload(cfg *Config) error {
	if cfg == nil {
		return errors.New("image policy: no configuration")
	}
	e.host.Install(e.build(cfg))
	return nil
}

// Config returns the configuration in use.
func (e *Engine) Config() *Config { return e.host.Current().config }

// current is the provider set in use.
func (e *Engine) current() *providerSet { return e.host.Current() }

func (e *Engine) build(cfg *Config) *providerSet {
	set := &providerSet{config: cfg, generation: e.gen.Add(1), byName: map[string]*provider{}}
	for _, pc := range cfg.Providers {
		p := &provider{cfg: pc, match: newMatcher(pc), watch: newFileWatch(pc.WatchFiles)}
		p.Plugin = execplugin.NewPlugin[Decision](e.host.Runtime, pc.Name, newExecRunner(pc, cfg.BinDir), execplugin.Hooks[policyapi.ImagePolicyRequest, *policyapi.ImagePolicyResponse]{
			Image: func(req policyapi.ImagePolicyRequest) string { return req.Image },
			// The pull's credential, sent to providers with sendCredentials.
			Secrets: func(req policyapi.ImagePolicyRequest, _ *policyapi.ImagePolicyResponse) []string {
				if req.Credential == nil {
					return nil
				}
				return []string{req.Credential.Password}
			},
		})
		set.providers = append(set.providers, p)
		set.byName[pc.Name] = p
	}
	return set
}

// Run purges expired verdicts every interval until ctx is done.
func (e *Engine) Run(ctx context.Context, interval time.Duration) { e.host.Run(ctx, interval) }

// namespaceOf is the namespace a subject is decided for.
func (set *providerSet) namespaceOf(s *Subject) string {
	if s.Pod.Namespace != "" {
		return s.Pod.Namespace
	}
	return set.config.DefaultNamespace
}

// maxRemembered bounds a set's memo of repositories: a node uses few; past
// it the memo starts again.
const maxRemembered = 8192

// repoInfo is what the engine makes of a subject's repository.
type repoInfo struct {
	// canonical is the repository as every spelling of its host has it
	// (keyring.CanonicalRepository): the plugins are told it, and verdicts
	// are cached under it.
	canonical string
	// matching says, for each provider, whether its matchImages match it.
	matching []bool
}

// repo is what the engine makes of repository (every provider matches an
// unknown one), remembered per repository: parsing and matching every
// pattern on each decision would be most of a cached decision's cost.
func (set *providerSet) repo(repository string) *repoInfo {
	if v, ok := set.repos.Load(repository); ok {
		return v.(*repoInfo)
	}
	info := &repoInfo{canonical: keyring.CanonicalRepository(repository), matching: make([]bool, len(set.providers))}
	repo := parsedRepository(repository)
	for i, p := range set.providers {
		info.matching[i] = p.match.matchesImage(repo)
	}
	if set.remembered.Add(1) > maxRemembered {
		set.repos.Clear()
		set.remembered.Store(0)
	}
	set.repos.Store(repository, info)
	return info
}

// parsedRepository is the subject's repository for matchImages; nil when
// unknown (or unparsable): every provider then applies.
func parsedRepository(repo string) *keyring.Repository {
	if repo == "" {
		return nil
	}
	r, ok := keyring.ParseRepository(repo)
	if !ok {
		return nil
	}
	return &r
}

// Applies reports, without running a plugin, whether some provider
// applies to images of repository ("" when unknown: an image known by ID
// only, which every provider of the namespace applies to) for namespace
// ("" is the default namespace). A caller that must do work before it can
// decide (ask the registry, the runtime) skips it when nothing applies:
// a namespace without a policy is not slowed down, nor refused when the
// registry cannot be asked.
func (e *Engine) Applies(namespace, repository string) bool {
	set := e.current()
	ns := namespace
	if ns == "" {
		ns = set.config.DefaultNamespace
	}
	matching := set.repo(repository).matching
	for i, p := range set.providers {
		if matching[i] && p.match.coversNamespace(ns) {
			return true
		}
	}
	return false
}

// NoMatchPolicy is what namespace ("" is the default namespace) does with
// an image no provider applies to. With Applies, it tells a caller whether
// a decision may refuse or must be counted before it does any work.
func (e *Engine) NoMatchPolicy(namespace string) NoMatchPolicy {
	set := e.current()
	if namespace == "" {
		namespace = set.config.DefaultNamespace
	}
	return set.config.NoMatch.For(namespace)
}

// Decide asks every provider that applies to the subject (its namespace in
// the provider's namespaces, its repository in its matchImages, or no
// repository known) in order, stopping at the first refusal. A verdict
// cached for the subject's image ID or digest, in that namespace, answers
// for its provider; else the plugin runs (once for concurrent callers with
// the same image and namespace: a verdict holds for a namespace, not a
// pod) and its verdict is cached for the provider's duration. A plugin's
// fault refuses under failurePolicy Fail, allows under Ignore, and is
// never cached. With no provider applying, the image is allowed.
//
// At PullImage, call it with the digest resolved at the registry, before
// the runtime pulls; at CreateContainer, for the container's image and for
// each image volume, with the image ID. The error is non-nil only for a
// subject that cannot be decided on (ErrInvalidSubject); the verdict then
// refuses, so a caller that looks at the verdict alone fails closed.
func (e *Engine) Decide(ctx context.Context, s Subject) (Verdict, error) {
	set := e.current()
	ns := set.namespaceOf(&s)
	info := set.repo(s.Repository)
	s.Repository = info.canonical
	v := Verdict{Namespace: ns, generation: set.generation, repository: s.Repository}
	if err := s.validate(); err != nil {
		return e.invalid(ctx, &s, v, err)
	}
	// Made here, not in the loop, so that the keys stay on the stack.
	keys := s.cacheKeys()
	identified := false
	v.Allowed = true
	for i, p := range set.providers {
		if !info.matching[i] || !p.match.coversNamespace(ns) {
			continue
		}
		if !identified {
			if err := s.validateIdentity(); err != nil {
				return e.invalid(ctx, &s, v, err)
			}
			identified = true
		}
		d := p.decide(ctx, &s, ns, keys)
		source := "plugin"
		if d.FromCache {
			source = "cache"
		}
		e.metrics.decisions.WithLabelValues(p.cfg.Name, string(s.Call), d.result(), source).Inc()
		v.Decisions = append(v.Decisions, d)
		if !d.Allowed {
			v.Allowed = false
			v.PodReason = d.PodReason
			break
		}
	}
	if len(v.Decisions) == 0 {
		e.noProvider(ctx, set, &s, &v)
	}
	e.logVerdict(ctx, &s, &v)
	return v, nil
}

// invalid is the refusal of a subject that cannot be decided on.
func (e *Engine) invalid(ctx context.Context, s *Subject, v Verdict, err error) (Verdict, error) {
	v.Allowed, v.invalid, v.PodReason = false, err, "image policy: the image cannot be identified"
	e.metrics.decisions.WithLabelValues("", "invalid", resultFailedClosed, "").Inc() // not the call: it may be anything
	e.log.WarnContext(ctx, "image policy: refused an image it cannot identify", "image", s.Image, "namespace", v.Namespace, "err", err)
	return v, err
}

// noProvider decides a subject no provider applies to, by its namespace's
// no-match policy: allowed, allowed with a warning, or refused. The pod
// reads that no policy covers the image (the image as it named it is in
// the caller's error; nothing of other namespaces' policies); the
// operator's log has the namespace, the repository and the rule.
func (e *Engine) noProvider(ctx context.Context, set *providerSet, s *Subject, v *Verdict) {
	v.NoMatchPolicy = set.config.NoMatch.For(v.Namespace)
	result := resultNoProvider
	switch v.NoMatchPolicy {
	case NoMatchDeny:
		result = resultNoProviderDenied
		v.Allowed = false
		v.PodReason = fmt.Sprintf("no image policy covers this image, and namespace %q runs only images a policy covers", v.Namespace)
	case NoMatchWarn:
		result = resultNoProviderWarned
		e.log.WarnContext(ctx, "image policy: no provider applies to an image; allowed by the namespace's noMatchPolicy Warn",
			"call", s.Call, "image", s.Image, "repository", s.Repository, "namespace", v.Namespace, "pod", s.Pod.Name, "podUID", s.Pod.UID)
	}
	e.metrics.decisions.WithLabelValues("", string(s.Call), result, "").Inc()
}

// Reason is the operator's account of the verdict: each provider's
// reason, or why none applied. Made on demand: a cached allow at
// CreateContainer must cost microseconds.
func (v Verdict) Reason() string {
	if v.invalid != nil {
		return v.invalid.Error()
	}
	if len(v.Decisions) == 0 {
		repo := v.repository
		if repo == "" {
			repo = "(known by ID only)"
		}
		what := "allowed"
		switch v.NoMatchPolicy {
		case NoMatchDeny:
			what = "refused"
		case NoMatchWarn:
			what = "allowed with a warning"
		}
		return fmt.Sprintf("no image policy provider applies to namespace %q and repository %s; the namespace's noMatchPolicy is %s: %s", v.Namespace, repo, v.NoMatchPolicy, what)
	}
	parts := make([]string, 0, len(v.Decisions))
	for _, d := range v.Decisions {
		what := "allowed"
		if !d.Allowed {
			what = "refused"
		}
		if d.FromCache {
			what += " (cached)"
		}
		r := d.Reason
		if d.Fault != "" {
			r = fmt.Sprintf("the plugin gave no verdict (%s); failurePolicy %s", d.Fault, d.FailurePolicy)
		}
		parts = append(parts, fmt.Sprintf("%s %s: %s", d.Provider, what, r))
	}
	return strings.Join(parts, "; ")
}

// logVerdict writes the decision log line (debug) and, for a refusal, an
// info line. Never a credential: images, pods and reasons only.
func (e *Engine) logVerdict(ctx context.Context, s *Subject, v *Verdict) {
	level := slog.LevelDebug
	msg := "image policy decision"
	if !v.Allowed {
		level, msg = slog.LevelInfo, "image policy refused an image"
	}
	if !e.log.Enabled(ctx, level) {
		return
	}
	e.log.Log(ctx, level, msg, "call", s.Call, "image", s.Image, "repository", s.Repository, "digest", s.Digest, "imageID", s.ImageID,
		"namespace", v.Namespace, "pod", s.Pod.Name, "podUID", s.Pod.UID, "static", s.Pod.Static, "allowed", v.Allowed, "reason", v.Reason())
}

// decide is one provider's decision: cached, or the plugin's.
func (p *provider) decide(ctx context.Context, s *Subject, ns string, keys []string) Decision {
	for _, k := range keys {
		if d, _, ok := p.Cache.Get(k, ns); ok {
			d.FromCache = true
			return d
		}
	}
	// A copy for the flight: the keys of a cached decision, the common
	// case, stay on the caller's stack.
	return p.flight(ctx, s, ns, slices.Clone(keys))
}

// flight runs the plugin once for concurrent callers with the same image
// and namespace.
func (p *provider) flight(ctx context.Context, s *Subject, ns string, keys []string) Decision {
	// The flight must not die with the first caller: the others wait on
	// it. The exec has its own timeout.
	flightCtx := context.WithoutCancel(ctx)
	// A caller that comes after a change of the plugin's files does not
	// share a flight that started before it.
	epoch := p.epoch.Load()
	v, _, _ := p.Cache.Do(authcache.FlightKey(keys[0], ns, strconv.FormatUint(epoch, 10)), func() (any, error) {
		// A caller that missed the cache just before an earlier flight
		// stored its verdict starts a flight of its own: look again, so
		// that one verdict means one plugin run.
		for _, k := range keys {
			if d, _, ok := p.Cache.Get(k, ns); ok {
				d.FromCache = true
				return d, nil
			}
		}
		return p.ask(flightCtx, s, ns, keys, epoch), nil
	})
	return v.(Decision)
}

// ask runs the plugin and caches its verdict under every key, unless the
// plugin's files changed since epoch, when the flight started: the plugin
// may have read them before the change.
func (p *provider) ask(ctx context.Context, s *Subject, ns string, keys []string, epoch uint64) Decision {
	req := policyapi.ImagePolicyRequest{
		Call: s.Call, Image: s.Image, Repository: s.Repository, Digest: s.Digest, ImageID: s.ImageID, Platform: s.Platform, Pod: s.Pod,
	}
	req.Pod.Namespace = ns
	if p.cfg.SendCredentials {
		req.Credential = s.Credential
	}
	resp, err := p.Call(ctx, req)
	if err != nil {
		d := Decision{Provider: p.cfg.Name, Fault: err.Error(), FailurePolicy: p.cfg.FailurePolicy, Allowed: p.cfg.FailurePolicy == Ignore}
		if !d.Allowed {
			d.PodReason = fmt.Sprintf("image policy %s could not decide; refused (see the node's log)", p.cfg.Name)
		}
		p.Log().WarnContext(ctx, "image policy plugin gave no verdict", "plugin", p.cfg.Name, "failurePolicy", p.cfg.FailurePolicy,
			"allowed", d.Allowed, "image", s.Image, "namespace", ns, "err", err)
		return d
	}
	d := Decision{Provider: p.cfg.Name, Allowed: *resp.Allowed, Reason: resp.Reason, PodReason: resp.PodReason, epoch: epoch}
	if !d.Allowed && d.PodReason == "" {
		d.PodReason = "refused by image policy " + p.cfg.Name
	}
	ttl := p.cfg.DenyCacheDuration
	if d.Allowed {
		ttl = p.cfg.AllowCacheDuration
	}
	if resp.CacheDuration != nil {
		ttl = resp.CacheDuration.Duration
	}
	if ttl > 0 {
		p.storeMu.Lock()
		if p.epoch.Load() == epoch {
			d.CachedUntil = p.Now().Add(ttl)
			for _, k := range keys {
				_ = p.Cache.Put(authcache.Image, k, ns, d, ttl) // only an unknown key type fails
			}
		}
		p.storeMu.Unlock()
	}
	return d
}

// Bind records, after the runtime pulled an image allowed at PullImage,
// that the pull's verdict holds for the image ID the pull produced, until
// it expires: CreateContainer then finds it cached. A refusal, a verdict
// made under an older configuration, and decisions that were not cached
// (faults, cacheDuration 0) are not bound; CreateContainer then asks the
// plugins again.
func (e *Engine) Bind(v Verdict, imageID string) {
	set := e.current()
	if !v.Allowed || imageID == "" || set.generation != v.generation {
		return
	}
	now := e.host.Clock().Now()
	for _, d := range v.Decisions {
		p := set.byName[d.Provider]
		if p == nil || d.Fault != "" || d.CachedUntil.IsZero() {
			continue
		}
		if ttl := d.CachedUntil.Sub(now); ttl > 0 {
			d.FromCache = false
			p.storeMu.Lock()
			if p.epoch.Load() == d.epoch { // not made before a change of the plugin's files
				_ = p.Cache.Put(authcache.Image, cacheKey(v.repository, imageID), v.Namespace, d, ttl)
			}
			p.storeMu.Unlock()
		}
	}
}
