package imagepolicy

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// providerSet is one configuration's providers, with fresh caches.
type providerSet struct {
	config     *Config
	generation uint64
	providers  []*provider
	byName     map[string]*provider
	repos      sync.Map // repository -> *repoInfo, see repo
	remembered atomic.Int64
}

func (set *providerSet) ConfigHash() string { return set.config.Hash }

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
