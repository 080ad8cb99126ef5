package imagepolicy

import (
	"fmt"
	"strings"
	"time"
)

// Explanation says what the engine would decide for a subject, and why,
// without running a plugin: for `records explain` and the operator.
type Explanation struct {
	Namespace  string `json:"namespace"`
	ConfigHash string `json:"configHash"`
	// Repository is the subject's repository as the plugins are told it
	// (every spelling of its host in one form); empty for an image known
	// by ID only.
	Repository string                `json:"repository,omitempty"`
	Providers  []ProviderExplanation `json:"providers"`
	// NoMatchPolicy is what the namespace does with an image no provider
	// applies to.
	NoMatchPolicy NoMatchPolicy `json:"noMatchPolicy"`
	// Verdict sums it up: allowed, refused, or which plugins a decision
	// would run.
	Verdict string `json:"verdict"`
}

// ProviderExplanation is one provider's part.
type ProviderExplanation struct {
	Provider string `json:"provider"`
	Applies  bool   `json:"applies"`
	// Why it applies or not.
	Why                string        `json:"why"`
	FailurePolicy      FailurePolicy `json:"failurePolicy"`
	SendCredentials    bool          `json:"sendCredentials"`
	AllowCacheDuration time.Duration `json:"allowCacheDuration"`
	DenyCacheDuration  time.Duration `json:"denyCacheDuration"`
	// WatchFiles are the plugin's files whose change drops its cached
	// verdicts; WatchFilesFromArgs when taken from its args.
	WatchFiles         []string `json:"watchFiles"`
	WatchFilesFromArgs bool     `json:"watchFilesFromArgs,omitempty"`
	// Cached is its verdict in the cache for the subject, if any.
	Cached *Decision `json:"cached,omitempty"`
}

// Explain tells, for each provider, whether it applies to the subject and
// what it has cached; it runs no plugin and changes nothing.
func (e *Engine) Explain(s Subject) Explanation {
	set := e.set.Load()
	ns := set.namespaceOf(&s)
	info := set.repo(s.Repository)
	s.Repository = info.canonical
	matching := info.matching
	x := Explanation{Namespace: ns, ConfigHash: set.config.Hash, Repository: s.Repository, NoMatchPolicy: set.config.NoMatch.For(ns)}
	keys := s.cacheKeys()
	var refusedBy string
	var toRun []string
	applying := 0
	for i, p := range set.providers {
		pe := ProviderExplanation{Provider: p.cfg.Name, FailurePolicy: p.cfg.FailurePolicy, SendCredentials: p.cfg.SendCredentials,
			AllowCacheDuration: p.cfg.AllowCacheDuration, DenyCacheDuration: p.cfg.DenyCacheDuration,
			WatchFiles: p.cfg.WatchFiles, WatchFilesFromArgs: p.cfg.WatchFilesFromArgs}
		switch {
		case !p.match.coversNamespace(ns):
			pe.Why = fmt.Sprintf("namespace %q is not in its namespaces (%s)", ns, strings.Join(p.cfg.Namespaces, ", "))
		case !matching[i]:
			pe.Why = fmt.Sprintf("repository %s matches none of its matchImages (%s)", s.Repository, strings.Join(p.cfg.MatchImages, ", "))
		default:
			pe.Applies = true
			applying++
			if s.Repository == "" {
				pe.Why = "the image is known by ID only: every provider of the namespace applies"
			} else {
				pe.Why = "its namespaces and matchImages cover the image"
			}
			for _, k := range keys {
				if d, _, ok := p.cache.Get(k, ns); ok {
					pe.Cached = &d
					break
				}
			}
			switch {
			case refusedBy != "":
			case pe.Cached == nil:
				toRun = append(toRun, p.cfg.Name)
			case !pe.Cached.Allowed:
				refusedBy = p.cfg.Name
			}
		}
		x.Providers = append(x.Providers, pe)
	}
	switch {
	case applying == 0 && x.NoMatchPolicy == NoMatchDeny:
		x.Verdict = fmt.Sprintf("refused: no provider applies, and namespace %q's noMatchPolicy is Deny", ns)
	case applying == 0 && x.NoMatchPolicy == NoMatchWarn:
		x.Verdict = fmt.Sprintf("allowed with a warning: no provider applies, and namespace %q's noMatchPolicy is Warn", ns)
	case applying == 0:
		x.Verdict = "allowed: no provider applies"
	case refusedBy != "" && len(toRun) == 0:
		x.Verdict = "refused: cached refusal of " + refusedBy
	case len(toRun) > 0:
		x.Verdict = "not cached: a decision runs " + strings.Join(toRun, ", ")
	default:
		x.Verdict = "allowed: cached by every provider that applies"
	}
	return x
}
