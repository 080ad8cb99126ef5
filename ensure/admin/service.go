package admin

import (
	"context"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// The Service's sides, a file each: Local does the work on the database
// (local.go); Client asks the daemon over its socket (client.go), where
// NewHandler answers (handler.go), served by NewServer to the allowed
// callers only (server.go).

// Export is every record, preloaded record and intent.
type Export struct {
	Records []*records.Record `json:"records"`
	// Preloaded are the names images were listed under before their first
	// recorded pull (the kubelet's ImagePreloadedRecord, by full name).
	Preloaded []*records.PreloadedRecord `json:"preloadedRecords,omitempty"`
	Intents   []records.Intent           `json:"intents"`
	Undecoded []string                   `json:"undecodedRecords,omitempty"`
	// UndecodedPreloaded are the image IDs of preloaded records that do
	// not decode: their names need verification.
	UndecodedPreloaded []string `json:"undecodedPreloadedRecords,omitempty"`
}

// RevokeResult says what a revoke changed.
type RevokeResult struct {
	Records int `json:"records"`
}

// GCResult says what a garbage collection dropped.
type GCResult struct {
	Records int `json:"records"`
	Grants  int `json:"grants"`
}

// Service is what the records commands do, against the daemon (Client) or
// the database file (Local).
type Service interface {
	List(ctx context.Context) (*Export, error)
	Get(ctx context.Context, imageRef string) (*records.Record, error)
	// Ages lists the verified credentials of imageRef's record with their
	// ages and, under the daemon's maximum record age, whether they expired.
	Ages(ctx context.Context, imageRef string) ([]decision.CredentialAge, error)
	Forget(ctx context.Context, imageRef string) (bool, error)
	RevokeImage(ctx context.Context, imageRef string) (RevokeResult, error)
	RevokeServiceAccount(ctx context.Context, namespace, name string) (RevokeResult, error)
	GC(ctx context.Context) (GCResult, error)
	Explain(ctx context.Context, image, podUID string) (*decision.Explanation, error)
	// ExplainPolicy says what the daemon's image policy would decide for a
	// container of namespace using image; only the daemon holds it.
	ExplainPolicy(ctx context.Context, image, namespace string) (*decision.PolicyExplanation, error)
	Resolve(ctx context.Context, image string) (string, error)
}

// Core is the enforcer's decisions: an *ensure.Decider on the database
// file when no daemon runs, the daemon's *ensure.Guard in the daemon.
type Core interface {
	Explain(ctx context.Context, image, podUID string) (*decision.Explanation, error)
	ResolveImage(ctx context.Context, image string) (string, error)
	PruneRecords(ctx context.Context, until time.Time) (int, error)
}

// Daemon is what only the running daemon (*ensure.Guard) holds: the pods'
// grants in memory, and its garbage collection, which also settles the
// intents a crash left.
type Daemon interface {
	DropGrants(imageRef string)
	GC(ctx context.Context) (records, grants int, err error)
}

// Policy is the daemon's image policy (*ensure.Guard): its verdicts are in
// its memory.
type Policy interface {
	ExplainPolicy(ctx context.Context, image, namespace string) (*decision.PolicyExplanation, error)
}
