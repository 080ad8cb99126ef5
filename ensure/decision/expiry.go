package decision

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// Expiry bounds how long a verified credential is re-used before it must
// be verified again against the registry: the KEP's dropped "recheck
// period", which users asked for because a credential verified once
// re-uses an image for ever, even after the registry revoked it. Optional
// (the zero Expiry never expires: the kubelet's behaviour). A credential
// with no verification time kept (verified before this existed) counts as
// expired where an age applies: on any doubt, verify.
type Expiry struct {
	// Default applies to every repository no pattern matches; 0 is none.
	Default time.Duration
	// ByRepository are patterns (the kubelet's matchImages syntax), the
	// first that matches a repository giving its maximum age.
	ByRepository []RepositoryAge
}

// RepositoryAge is the maximum age of the records of repositories matching
// Pattern.
type RepositoryAge struct {
	Pattern string
	MaxAge  time.Duration
}

// MaxAge is the maximum age of repo's verified credentials; 0 is none.
func (e *Expiry) MaxAge(repo string) time.Duration {
	if e == nil {
		return 0
	}
	for _, r := range e.ByRepository {
		if keyring.MatchImage(r.Pattern, repo) {
			return r.MaxAge
		}
	}
	return e.Default
}

// Validate checks an expiry configuration; path names it in errors.
func (e *Expiry) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if e.Default < 0 {
		errs = append(errs, field.Invalid(path.Child("maxRecordAge"), e.Default.String(), "must not be negative (0: records do not expire)"))
	}
	for i, r := range e.ByRepository {
		p := path.Child("maxRecordAgeByRepository").Index(i)
		if err := keyring.ValidateMatchImage(r.Pattern); err != nil || r.Pattern == "" {
			errs = append(errs, field.Invalid(p.Child("pattern"), r.Pattern, fmt.Sprintf("a repository pattern as in matchImages: %v", err)))
		}
		if r.MaxAge <= 0 {
			errs = append(errs, field.Invalid(p.Child("maxAge"), r.MaxAge.String(), "must be positive"))
		}
	}
	return errs
}

// CredentialAge is how old one verified credential of a record is, and
// whether it has expired (records show --ages).
type CredentialAge struct {
	Repository string `json:"repository"`
	// Credential names it: "secret NAMESPACE/NAME", "credential HASH…"
	// (a salted hash, without the API), "service account NAMESPACE/NAME"
	// or "node" (anonymous or node-wide).
	Credential string `json:"credential"`
	// VerifiedAt is when it was last verified; zero when no time is kept.
	VerifiedAt time.Time `json:"verifiedAt,omitzero"`
	// MaxAge is the repository's maximum record age; 0 is none.
	MaxAge  time.Duration `json:"maxAge,omitempty"`
	Expired bool          `json:"expired"`
}

// VerificationTimes is where the verification times of records are read
// (records.Store.VerifiedAt).
type VerificationTimes interface {
	// VerifiedAt returns when the credential named key
	// (records.CredentialKeys) was last verified for imageRef as repo;
	// false when no time is kept.
	VerifiedAt(imageRef, repo, key string) (time.Time, bool, error)
}

// CredentialAges lists the verified credentials of rec with their ages
// under expiry (nil: none) at now, repositories in order.
func CredentialAges(store VerificationTimes, rec *records.Record, expiry *Expiry, now time.Time) ([]CredentialAge, error) {
	var out []CredentialAge
	for _, repo := range slices.Sorted(maps.Keys(rec.CredentialMapping)) {
		c := rec.CredentialMapping[repo]
		type named struct {
			name string
			keys []string
		}
		var creds []named
		if c.NodePodsAccessible {
			creds = append(creds, named{"node", []string{records.NodeKey}})
		}
		for _, s := range c.KubernetesSecrets {
			name := "secret " + s.Namespace + "/" + s.Name
			if s.UID == "" {
				name = "credential " + shortHash(s.CredentialHash)
			}
			creds = append(creds, named{name, records.SecretKeys(s)})
		}
		for _, sa := range c.KubernetesServiceAccounts {
			creds = append(creds, named{"service account " + sa.Namespace + "/" + sa.Name, []string{records.AccountKey(sa)}})
		}
		max := expiry.MaxAge(repo)
		for _, cr := range creds {
			a := CredentialAge{Repository: repo, Credential: cr.name, MaxAge: max}
			for _, k := range cr.keys {
				t, ok, err := store.VerifiedAt(rec.ImageRef, repo, k)
				if err != nil {
					return nil, err
				}
				if ok && t.After(a.VerifiedAt) {
					a.VerifiedAt = t
				}
			}
			a.Expired = max > 0 && (a.VerifiedAt.IsZero() || a.VerifiedAt.After(now) || now.Sub(a.VerifiedAt) > max)
			out = append(out, a)
		}
	}
	return out, nil
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}
