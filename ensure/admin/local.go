package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Local works on a Store directly, with the Core for the decisions (nil
// without a runtime to ask) and, in the daemon, the Daemon and its Policy.
type Local struct {
	Store  *records.Store
	Core   Core
	Daemon Daemon // nil outside the daemon
	Policy Policy // nil outside the daemon
	Now    func() time.Time
}

// offlineGrace is how old a record of an absent image must be for a
// records gc with no daemon to drop it: the daemon's default grace.
const offlineGrace = 10 * time.Minute

var _ Service = (*Local)(nil)

func (l *Local) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l *Local) List(context.Context) (*Export, error) {
	recs, bad, err := l.Store.List()
	if err != nil {
		return nil, err
	}
	pre, badPre, err := l.Store.PreloadedRecords()
	if err != nil {
		return nil, err
	}
	intents, err := l.Store.Intents()
	if err != nil {
		return nil, err
	}
	return &Export{Records: recs, Preloaded: pre, Intents: intents, Undecoded: bad, UndecodedPreloaded: badPre}, nil
}

func (l *Local) Get(_ context.Context, ref string) (*records.Record, error) { return l.Store.Get(ref) }

func (l *Local) Ages(_ context.Context, ref string) ([]decision.CredentialAge, error) {
	rec, err := l.Store.Get(ref)
	if err != nil {
		return nil, err
	}
	var expiry *decision.Expiry
	if e, ok := l.Core.(interface{ Expiry() *decision.Expiry }); ok {
		expiry = e.Expiry()
	}
	return decision.CredentialAges(l.Store, rec, expiry, time.Now())
}

func (l *Local) Forget(_ context.Context, ref string) (bool, error) {
	ok, err := l.Store.Forget(ref)
	if err == nil && l.Daemon != nil {
		l.Daemon.DropGrants(ref)
	}
	return ok, err
}

func (l *Local) RevokeImage(_ context.Context, ref string) (RevokeResult, error) {
	ok, err := l.Store.RevokeImage(ref, l.now())
	if err == nil && l.Daemon != nil {
		l.Daemon.DropGrants(ref)
	}
	n := 0
	if ok {
		n = 1
	}
	return RevokeResult{Records: n}, err
}

// RevokeServiceAccount removes the account from every record and, in the
// daemon, drops the in-memory grants of those images: grants do not say
// which credential earned them, so every pod re-checks at its next
// container start (one that still has a verified credential passes).
func (l *Local) RevokeServiceAccount(_ context.Context, ns, name string) (RevokeResult, error) {
	refs, err := l.Store.RevokeServiceAccount(ns, name, l.now())
	if l.Daemon != nil {
		for _, ref := range refs {
			l.Daemon.DropGrants(ref)
		}
	}
	return RevokeResult{Records: len(refs)}, err
}

func (l *Local) GC(ctx context.Context) (GCResult, error) {
	switch {
	case l.Daemon != nil:
		r, g, err := l.Daemon.GC(ctx)
		return GCResult{Records: r, Grants: g}, err
	case l.Core != nil:
		r, err := l.Core.PruneRecords(ctx, l.now().Add(-offlineGrace))
		return GCResult{Records: r}, err
	}
	return GCResult{}, errors.New("gc needs the container runtime")
}

func (l *Local) Explain(ctx context.Context, image, podUID string) (*decision.Explanation, error) {
	if l.Core == nil {
		return nil, errors.New("explain needs the container runtime")
	}
	return l.Core.Explain(ctx, image, podUID)
}

func (l *Local) ExplainPolicy(ctx context.Context, image, namespace string) (*decision.PolicyExplanation, error) {
	if l.Policy == nil {
		return nil, errors.New("the image policy's verdicts are in the daemon's memory: explain --namespace needs the daemon")
	}
	return l.Policy.ExplainPolicy(ctx, image, namespace)
}

func (l *Local) Resolve(ctx context.Context, image string) (string, error) {
	if imageref.IsID(image) {
		if !strings.HasPrefix(image, "sha256:") {
			image = "sha256:" + image
		}
		return image, nil
	}
	if l.Core == nil {
		return "", fmt.Errorf("%q is not an image ID (sha256:...), and resolving names needs the container runtime", image)
	}
	return l.Core.ResolveImage(ctx, image)
}
