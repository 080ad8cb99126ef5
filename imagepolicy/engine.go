package imagepolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

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
