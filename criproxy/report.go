package criproxy

import (
	"context"
	"sync"
)

// PullCredential tells the outer hooks of a PullImage which credential an
// inner hook pulled with: the ensure hook records service accounts, and
// must not mistake a pod's token credential for a node-wide one.
type PullCredential struct {
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
	cred *PullCredential
}

// WithPullReport returns a context in which inner hooks can report the
// credential they pulled with, and a function that returns it once the
// call is done (false when nothing was reported).
func WithPullReport(ctx context.Context) (context.Context, func() (PullCredential, bool)) {
	r := &pullReport{}
	return context.WithValue(ctx, pullReportKey{}, r), func() (PullCredential, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.cred == nil {
			return PullCredential{}, false
		}
		return *r.cred, true
	}
}

// ReportPullCredential records, for the outer hooks, the credential a
// successful pull used. Without WithPullReport up the chain it does
// nothing.
func ReportPullCredential(ctx context.Context, c PullCredential) {
	if r, ok := ctx.Value(pullReportKey{}).(*pullReport); ok {
		r.mu.Lock()
		r.cred = &c
		r.mu.Unlock()
	}
}
