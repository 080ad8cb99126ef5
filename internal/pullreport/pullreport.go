package pullreport

import (
	"context"
	"sync"

	digest "github.com/opencontainers/go-digest"
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

// Verification is the registry's own word on the credential a pull went
// with: the image's registry (or a mirror the operator vouched for)
// resolved the name to this image for it, and holds each of its blobs in
// the repository.
type Verification struct {
	ImageID        string // the image the registry's answer is (its config digest)
	Registry       string // the registry the name names
	Endpoint       string // who answered: the registry, or a vouched-for mirror
	Vouched        bool
	CredentialKind string // anonymous, basic, identity token, registry token
	ManifestDigest string
	Blobs          int // blobs checked in the repository
	// CheckedBlobs names the blobs found present (the config, then the
	// layers), at most MaxListedBlobs of them: what explain shows.
	CheckedBlobs []string
	Requests     int // requests the check made
	// FromNode: the image was already on the node; the registry's answer
	// stood for the pull, and the runtime was not asked to pull.
	FromNode bool
	// Layers are the image's layers (diff_ids, from its config the check
	// fetched), each vouched for by the repository (LayersKnown: the check
	// read them); ProvenLayers those it proved by their bytes, at the cost
	// of ProvenBytes.
	Layers       []digest.Digest
	LayersKnown  bool
	ProvenLayers []digest.Digest
	ProvenBytes  int64
}

// MaxListedBlobs bounds CheckedBlobs: the daemon keeps thousands of
// verifications in memory for explain.
const MaxListedBlobs = 16

type pullReportKey struct{}

// Call is what the hooks of one PullImage tell each other.
type Call struct {
	mu       sync.Mutex
	cred     *Credential
	present  string
	verified *Verification
}

// Start returns a context in which inner hooks can report to the outer
// ones, and the Call they report to.
func Start(ctx context.Context) (context.Context, *Call) {
	c := &Call{}
	return context.WithValue(ctx, pullReportKey{}, c), c
}

// With is Start for a caller that reads only the credential: it returns
// a function that gives it once the call is done (false when nothing was
// reported).
func With(ctx context.Context) (context.Context, func() (Credential, bool)) {
	ctx, c := Start(ctx)
	return ctx, c.Credential
}

func from(ctx context.Context) *Call {
	c, _ := ctx.Value(pullReportKey{}).(*Call)
	return c
}

// Credential returns the credential reported, false when none was.
func (c *Call) Credential() (Credential, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cred == nil {
		return Credential{}, false
	}
	return *c.cred, true
}

// Verified returns the registry's verification reported, nil when none.
func (c *Call) Verified() *Verification {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.verified
}

// SetPresent tells the inner hooks which image the name stood for on the
// node before the pull (it was hidden from this pod): a registry check
// that finds the same image may answer from the node.
func (c *Call) SetPresent(imageID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.present = imageID
}

// Report records, for the outer hooks, the credential a successful pull
// used. Without Start up the chain it does nothing.
func Report(ctx context.Context, cred Credential) {
	if c := from(ctx); c != nil {
		c.mu.Lock()
		c.cred = &cred
		c.mu.Unlock()
	}
}

// ReportVerified records the registry's verification of the pull's
// credential. Without Start up the chain it does nothing.
func ReportVerified(ctx context.Context, v Verification) {
	if c := from(ctx); c != nil {
		c.mu.Lock()
		c.verified = &v
		c.mu.Unlock()
	}
}

// Present is what SetPresent said, "" without it.
func Present(ctx context.Context) string {
	if c := from(ctx); c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.present
	}
	return ""
}
