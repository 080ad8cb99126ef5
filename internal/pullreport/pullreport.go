package pullreport

import (
	"context"
	"sync"
)

// Credential tells the outer hooks of a PullImage which credential an
// inner hook pulled with: the ensure hook records service accounts, and
// must not mistake a pod's token credential for a node-wide one.
type Credential struct {
	// Provider is the credential provider plugin whose credential pulled
	// the image.
	Provider string
	// ServiceAccount is the pod's service account when the plugin was fed
	// its token (KEP-4412); nil for node-wide plugin credentials.
	ServiceAccount *ServiceAccountRef
}

// ServiceAccountRef names a service account.
type ServiceAccountRef struct {
	Namespace, Name, UID string
}

type pullReportKey struct{}

type pullReport struct {
	mu   sync.Mutex
	cred *Credential
}

// With returns a context in which inner hooks can report the
// credential they pulled with, and a function that returns it once the
// call is done (false when nothing was reported).
func With(ctx context.Context) (context.Context, func() (Credential, bool)) {
	r := &pullReport{}
	return context.WithValue(ctx, pullReportKey{}, r), func() (Credential, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.cred == nil {
			return Credential{}, false
		}
		return *r.cred, true
	}
}

// Report records, for the outer hooks, the credential a
// successful pull used. Without With up the chain it does
// nothing.
func Report(ctx context.Context, c Credential) {
	if r, ok := ctx.Value(pullReportKey{}).(*pullReport); ok {
		r.mu.Lock()
		r.cred = &c
		r.mu.Unlock()
	}
}
