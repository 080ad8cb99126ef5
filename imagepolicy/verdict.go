package imagepolicy

import (
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

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
