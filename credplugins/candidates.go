package credplugins

import (
	"context"
	"errors"
	"sort"

	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// Candidate is one credential to try for a pull, and where it came from.
type Candidate struct {
	Provider string
	// Key is the auth map key that matched the image.
	Key        string
	Credential Credential
	// ServiceAccount is the account whose token got the credential; nil for
	// node-wide credentials.
	ServiceAccount *pullcred.ServiceAccount
}

// ProviderError is a provider that matched an image but gave no answer.
type ProviderError struct {
	Provider string
	Err      error
}

// Lookup runs (or reads from cache) every provider whose matchImages match
// image, a repository without tag or digest, and returns the credentials to
// try, in order:
//   - auth keys that match the image by the same rules as matchImages,
//   - keys without a glob before keys with one, longer keys first (more
//     specific), then the kubelet's reverse lexical order, then the order of
//     the providers in the configuration (the earlier wins a shared key),
//   - for a Docker Hub image with no other match, Docker Hub's key
//     (https://index.docker.io/v1/), as the kubelet's keyring falls back to
//     it (keyring.Serving),
//   - each distinct credential once.
//
// Providers that failed are returned as well; the others' candidates are
// still usable.
func (in *Injector) Lookup(ctx context.Context, image string, pod *PodRef) ([]Candidate, []Answer, []ProviderError) {
	var answers []Answer
	var failed []ProviderError
	for _, p := range in.plugins() {
		if !p.matches(image) {
			continue
		}
		a, err := p.provide(ctx, image, pod)
		if err != nil {
			if errors.Is(err, ErrNoServiceAccountCredential) {
				in.log.Debug("token credential provider not run for this pod", "plugin", p.cfg.Name, "image", image, "reason", err)
			} else {
				in.log.Warn("credential provider failed", "plugin", p.cfg.Name, "image", image, "err", err)
			}
			failed = append(failed, ProviderError{Provider: p.cfg.Name, Err: err})
			continue
		}
		answers = append(answers, a)
	}
	return candidates(image, answers), answers, failed
}

// candidates orders the credentials of answers for image.
func candidates(image string, answers []Answer) []Candidate {
	type ranked struct {
		Candidate
		key      string // Key normalized (AuthKey): what the order compares
		provider int
	}
	var keyed []ranked
	for i, a := range answers {
		for raw, cred := range a.Auth {
			if k, ok := keyring.AuthKey(raw); ok {
				keyed = append(keyed, ranked{Candidate{Provider: a.Provider, Key: raw, Credential: cred, ServiceAccount: a.ServiceAccount}, k, i})
			}
		}
	}
	// All the answers at once, as the kubelet's keyring holds them: a key
	// that matches in one answer turns Docker Hub's fallback off in all.
	all := keyring.Serving(image, keyed, func(r ranked) string { return r.key })
	sort.SliceStable(all, func(i, j int) bool {
		a, b := all[i], all[j]
		ka, kb := a.key, b.key
		if wa, wb := keyring.IsWildcard(ka), keyring.IsWildcard(kb); wa != wb {
			return !wa
		}
		if len(ka) != len(kb) {
			return len(ka) > len(kb)
		}
		if ka != kb {
			return ka > kb
		}
		return a.provider < b.provider
	})
	var out []Candidate
	seen := map[Credential]bool{}
	for _, c := range all {
		if seen[c.Credential] {
			continue // the same credential under another key: one try is enough
		}
		seen[c.Credential] = true
		out = append(out, c.Candidate)
	}
	return out
}
