package credplugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// Credential is one username and password a plugin answered.
type Credential = keyring.Credential

// Auth is a plugin's auth map: match keys (registry patterns) to
// credentials.
type Auth = keyring.Auth

// Answer is what one provider gave for one image.
type Answer struct {
	Provider     string
	Auth         Auth
	CacheKeyType authcache.KeyType
	// CacheDuration is how long the answer is cached: the response's
	// cacheDuration, else the provider's default; 0 means not cached.
	CacheDuration time.Duration
	FromCache     bool
	// ServiceAccount is the account whose token the plugin was given
	// (KEP-4412); nil for a plain plugin, whose credentials are node-wide.
	ServiceAccount *pullreport.ServiceAccountRef
}

// plugin is one configured provider with its cache, as the kubelet's
// pluginProvider: a cache per provider, one exec per image (and token) at a
// time.
type plugin struct {
	cfg Provider
	// definition identifies what the plugin does (definition()): a
	// reload keeps the plugin, and its cache, while it is the same.
	definition string
	runner     runner
	identity   Identity // for token providers
	cache      *authcache.Cache[Answer]
	metrics    *metrics
	log        *slog.Logger
	now        func() time.Time
}

// matches reports whether the provider handles image.
func (p *plugin) matches(image string) bool {
	for _, m := range p.cfg.MatchImages {
		if keyring.MatchImage(m, image) {
			return true
		}
	}
	return false
}

// provide returns the provider's answer for image (a repository without tag
// or digest), from the cache when it holds one, else by running the plugin.
// Concurrent calls for one image (and, for a token provider, one token)
// run it once. A token provider (tokenAttributes) works for pod, as the
// kubelet does.
func (p *plugin) provide(ctx context.Context, image string, pod *PodRef) (Answer, error) {
	var sa saRequest
	if p.cfg.TokenAttributes != nil {
		var err error
		if sa, err = p.serviceAccountRequest(ctx, pod); err != nil {
			return Answer{}, err
		}
	}
	if a, _, ok := p.cache.Get(image, sa.cacheKey); ok {
		p.metrics.lookups.WithLabelValues(p.cfg.Name, "hit").Inc()
		a.FromCache = true
		return a, nil
	}
	p.metrics.lookups.WithLabelValues(p.cfg.Name, "miss").Inc()
	// The flight must not die with the first caller: the others wait on it.
	// The exec has its own timeout.
	flightCtx := context.WithoutCancel(ctx)
	v, err, _ := p.cache.Do(sa.flightKey(image), func() (any, error) {
		return p.exec(flightCtx, image, sa)
	})
	if err != nil {
		return Answer{}, err
	}
	return v.(Answer), nil
}

// exec runs the plugin, caches its answer and returns it.
func (p *plugin) exec(ctx context.Context, image string, sa saRequest) (Answer, error) {
	start := p.now()
	resp, stderr, err := p.runner.run(ctx, execRequest{Image: image, ServiceAccountToken: sa.token, ServiceAccountAnnotations: sa.annotations})
	p.metrics.duration.WithLabelValues(p.cfg.Name).Observe(p.now().Sub(start).Seconds())
	if len(stderr) > 0 && p.log.Enabled(ctx, slog.LevelDebug) {
		// A plugin's diagnostics, at debug level, capped, with every secret
		// the proxy knows of (the token it sent, the passwords it got back)
		// and anything shaped like a token or an auth header masked.
		// stdout (credentials) is never logged.
		known := []string{sa.token}
		if resp != nil {
			for _, c := range resp.Auth {
				known = append(known, c.Password)
			}
		}
		p.log.DebugContext(ctx, "credential provider plugin wrote to stderr", "plugin", p.cfg.Name, "image", image,
			"stderr", truncate(redact(string(stderr), known), maxLoggedStderr))
	}
	if err != nil {
		p.metrics.calls.WithLabelValues(p.cfg.Name, resultOf(err)).Inc()
		return Answer{}, err
	}

	a := Answer{Provider: p.cfg.Name, CacheKeyType: authcache.KeyType(resp.CacheKeyType), Auth: make(Auth, len(resp.Auth)), ServiceAccount: sa.account}
	for k, c := range resp.Auth {
		a.Auth[k] = Credential{Username: c.Username, Password: c.Password}
	}
	if p.cfg.TokenAttributes != nil && p.cfg.TokenAttributes.CacheType != "Token" && echoesToken(a.Auth, sa.token) {
		// As the kubelet: a credential that is the token itself is only valid
		// as long as the token; cached per service account it would outlive it.
		p.metrics.calls.WithLabelValues(p.cfg.Name, resultInvalidResponse).Inc()
		return Answer{}, fmt.Errorf("plugin %s: %w: it returned the service account token as a password, which needs cacheType Token", p.cfg.Name, ErrInvalidResponse)
	}
	p.metrics.calls.WithLabelValues(p.cfg.Name, resultSuccess).Inc()
	// nil: the provider's default; an explicit 0: not cached.
	a.CacheDuration = p.cfg.DefaultCacheDuration
	if resp.CacheDuration != nil {
		a.CacheDuration = resp.CacheDuration.Duration
	}
	if err := p.cache.Put(a.CacheKeyType, image, sa.cacheKey, a, a.CacheDuration); err != nil {
		return Answer{}, err // unreachable: pluginapi.DecodeResponse checked the key type
	}
	return a, nil
}

func resultOf(err error) string {
	switch {
	case errors.Is(err, ErrPluginTimeout):
		return resultTimeout
	case errors.Is(err, ErrInvalidResponse):
		return resultInvalidResponse
	case errors.Is(err, ErrPluginOutputLimit):
		return resultOutputTooLarge
	}
	return resultFailed
}

// maxLoggedStderr caps what a debug line quotes of a plugin's stderr.
const maxLoggedStderr = 1024

// secretShaped matches what may be a secret a plugin printed that the
// proxy does not know: a JWT (a service account token), a Basic or Bearer
// authorization value, and key=value or "key": "value" pairs whose key
// names a secret.
var secretShaped = regexp.MustCompile(`eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]*)?` +
	`|(?i)\b(basic|bearer)\s+[A-Za-z0-9._~+/=-]+` +
	`|(?i)"?(password|passwd|secret|token|auth|authorization|identitytoken|registrytoken)"?\s*[:=]\s*"?((basic|bearer)\s+)?[^\s",}]+`)

// redact masks the known secrets and anything secret-shaped in s.
func redact(s string, known []string) string {
	for _, k := range known {
		if k != "" {
			s = strings.ReplaceAll(s, k, "[redacted]")
		}
	}
	return secretShaped.ReplaceAllString(s, "[redacted]")
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…(truncated)"
}

// Compile-time check: the exec plugin is a runner.
var _ runner = (*execPlugin)(nil)
