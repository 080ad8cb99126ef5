package credplugins

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
)

// Credential is one username and password a plugin answered.
type Credential struct {
	Username, Password string
}

// Auth is a plugin's auth map: match keys (registry patterns) to
// credentials.
type Auth map[string]Credential

// Answer is what one provider gave for one image.
type Answer struct {
	Provider     string
	Auth         Auth
	CacheKeyType authcache.KeyType
	// CacheDuration is how long the answer is cached: the response's
	// cacheDuration, else the provider's default; 0 means not cached.
	CacheDuration time.Duration
	FromCache     bool
}

// plugin is one configured provider with its cache, as the kubelet's
// pluginProvider: a cache per provider, one exec per image at a time.
type plugin struct {
	cfg     Provider
	runner  runner
	cache   *authcache.Cache[Answer]
	metrics *metrics
	log     *slog.Logger
	now     func() time.Time
}

// matches reports whether the provider handles image.
func (p *plugin) matches(image string) bool {
	for _, m := range p.cfg.MatchImages {
		if MatchImage(m, image) {
			return true
		}
	}
	return false
}

// provide returns the provider's answer for image (a repository without tag
// or digest), from the cache when it holds one, else by running the plugin.
// Concurrent calls for one image run the plugin once.
func (p *plugin) provide(ctx context.Context, image string) (Answer, error) {
	if a, _, ok := p.cache.Get(image, ""); ok {
		p.metrics.lookups.WithLabelValues(p.cfg.Name, "hit").Inc()
		a.FromCache = true
		return a, nil
	}
	p.metrics.lookups.WithLabelValues(p.cfg.Name, "miss").Inc()
	// The flight must not die with the first caller: the others wait on it.
	// The exec has its own timeout.
	flightCtx := context.WithoutCancel(ctx)
	v, err, _ := p.cache.Do(authcache.FlightKey(image), func() (any, error) {
		return p.exec(flightCtx, image)
	})
	if err != nil {
		return Answer{}, err
	}
	return v.(Answer), nil
}

// exec runs the plugin, caches its answer and returns it.
func (p *plugin) exec(ctx context.Context, image string) (Answer, error) {
	start := p.now()
	resp, stderr, err := p.runner.run(ctx, execRequest{Image: image})
	p.metrics.duration.WithLabelValues(p.cfg.Name).Observe(p.now().Sub(start).Seconds())
	if len(stderr) > 0 {
		// A plugin's diagnostics, bounded; stdout (credentials) is never logged.
		p.log.Warn("credential provider plugin wrote to stderr", "plugin", p.cfg.Name, "image", image,
			"stderr", truncate(string(stderr), 2048))
	}
	if err != nil {
		p.metrics.calls.WithLabelValues(p.cfg.Name, resultOf(err)).Inc()
		return Answer{}, err
	}
	p.metrics.calls.WithLabelValues(p.cfg.Name, resultSuccess).Inc()

	a := Answer{Provider: p.cfg.Name, CacheKeyType: authcache.KeyType(resp.CacheKeyType), Auth: make(Auth, len(resp.Auth))}
	for k, c := range resp.Auth {
		a.Auth[k] = Credential{Username: c.Username, Password: c.Password}
	}
	// nil: the provider's default; an explicit 0: not cached.
	a.CacheDuration = p.cfg.DefaultCacheDuration
	if resp.CacheDuration != nil {
		a.CacheDuration = resp.CacheDuration.Duration
	}
	if err := p.cache.Put(a.CacheKeyType, image, "", a, a.CacheDuration); err != nil {
		return Answer{}, err // unreachable: decodeResponse checked the key type
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

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…(truncated)"
}

// Compile-time check: the exec plugin is a runner.
var _ runner = (*execPlugin)(nil)
