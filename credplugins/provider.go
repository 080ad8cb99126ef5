package credplugins

import (
	"context"
	"time"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
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
	ServiceAccount *pullcred.ServiceAccount
}

// plugin is one configured provider with its cache, as the kubelet's
// pluginProvider: a cache per provider, one exec per image (and token) at a
// time. The cache is keyed the kubelet's way (authcache: the response's
// cacheKeyType, the service account part of KEP-4412).
type plugin struct {
	*execplugin.Plugin[execRequest, *credentialproviderapi.CredentialProviderResponse, Answer]
	cfg Provider
	// definition identifies what the plugin does (definition()): a
	// reload keeps the plugin, and its cache, while it is the same.
	definition string
	identity   Identity // for token providers
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
	if a, _, ok := p.Cache.Get(image, sa.cacheKey); ok {
		p.CountLookup(true)
		a.FromCache = true
		return a, nil
	}
	p.CountLookup(false)
	// The flight must not die with the first caller: the others wait on it.
	// The exec has its own timeout.
	flightCtx := context.WithoutCancel(ctx)
	v, err, _ := p.Cache.Do(sa.flightKey(image), func() (any, error) {
		return p.exec(flightCtx, image, sa)
	})
	if err != nil {
		return Answer{}, err
	}
	return v.(Answer), nil
}

// exec runs the plugin, caches its answer and returns it.
func (p *plugin) exec(ctx context.Context, image string, sa saRequest) (Answer, error) {
	resp, err := p.Call(ctx, execRequest{Image: image, ServiceAccountToken: sa.token, ServiceAccountAnnotations: sa.annotations})
	if err != nil {
		return Answer{}, err
	}
	a := Answer{Provider: p.cfg.Name, CacheKeyType: authcache.KeyType(resp.CacheKeyType), Auth: make(Auth, len(resp.Auth)), ServiceAccount: sa.account}
	for k, c := range resp.Auth {
		a.Auth[k] = Credential{Username: c.Username, Password: c.Password}
	}
	// nil: the provider's default; an explicit 0: not cached.
	a.CacheDuration = p.cfg.DefaultCacheDuration
	if resp.CacheDuration != nil {
		a.CacheDuration = resp.CacheDuration.Duration
	}
	if err := p.Cache.Put(a.CacheKeyType, image, sa.cacheKey, a, a.CacheDuration); err != nil {
		return Answer{}, err // unreachable: pluginapi.DecodeResponse checked the key type
	}
	return a, nil
}

// secretsOf are what a debug line must mask of a call: the token sent,
// the passwords answered. stdout (credentials) is never logged.
func secretsOf(req execRequest, resp *credentialproviderapi.CredentialProviderResponse) []string {
	known := []string{req.ServiceAccountToken}
	if resp != nil {
		for _, c := range resp.Auth {
			known = append(known, c.Password)
		}
	}
	return known
}
