package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// RecordStore is what the guard needs of the database; *Store is the
// real one, ensuretest.MemoryStore a fake that passes the same
// conformance suite.
type RecordStore interface {
	// Get returns the record of an image ID, or an error wrapping
	// ErrNotFound.
	Get(imageRef string) (*Record, error)
	// HashAuth returns the salted hash of a request's credential, "" for none.
	HashAuth(Auth) string
	// AddIntent durably notes a pull about to start and returns its ID.
	AddIntent(image string) (string, error)
	// DropIntent removes an intent.
	DropIntent(id string) error
	// Intents lists the intents.
	Intents() ([]Intent, error)
	// RecordPull adds cred for repo to imageRef's record and drops the
	// intent, atomically and durably.
	RecordPull(imageRef, repo string, cred Credential, intentID string, now time.Time) error
	// Forget deletes a record and reports whether there was one.
	Forget(imageRef string) (bool, error)
	// Counts returns the numbers of records and intents.
	Counts() (records, intents int, err error)
	// Prune deletes the records of images not present, last updated before until.
	Prune(present func(imageRef string) bool, until time.Time) (int, error)
	// VerifiedAt returns when the credential named key
	// (records.CredentialKeys) was last verified for imageRef as repo;
	// false when no time is kept.
	VerifiedAt(imageRef, repo, key string) (time.Time, bool, error)
	// Restricted reports whether some record has a mapping for repo that is
	// not accessible to every pod. It may err towards true, never towards
	// false. It must be cheap: it runs on every ImageStatus.
	Restricted(repo string) bool
}

var _ RecordStore = (*records.Store)(nil)

// GuardOptions configure a Guard.
type GuardOptions struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Clock      clock.PassiveClock
	// HideTTL is how long a PullImage may follow its ImageStatus to be
	// answered from the node. Default 2m.
	HideTTL time.Duration
	// GracePeriod keeps records of images the runtime no longer lists, and
	// grants of pods it no longer runs, this long. Default 10m.
	GracePeriod time.Duration
	// Pods reads the node's pods from the Kubernetes API; nil without one.
	// With it, service accounts are checked on verified re-uses, and an
	// image is shown to ImageStatus (and CreateContainer allowed) when the
	// pods waiting for it are entitled to it.
	Pods NodePods
	// Accounts re-checks service-account re-uses against the token plugins
	// as they are now; nil means none are configured, and a pull recorded
	// for a service account is then never re-used.
	Accounts AccountCheck
}

// Guard is the set of CRI hooks that enforce the policy. It is safe for
// concurrent use.
type Guard struct {
	// Decider is the core the CRI path shares with records explain: the
	// records, the policy, the runtime and the pulls in flight.
	Decider
	grants *grantTable
	hidden *hideTable
	// refs order a pull's record against RemoveImage's forget.
	refs     *refLocks
	metrics  *metrics
	clock    clock.PassiveClock
	grace    time.Duration
	pods     NodePods
	accounts AccountCheck

	// leftover are the intents found at start: pulls a crash interrupted.
	// Until Recover settles them, their repositories count as pulls in
	// flight, so their images are not taken for preloaded ones.
	leftoverMu    sync.Mutex
	leftover      []Intent
	leftoverCount atomic.Int64
	examined      bool // a settle has compared them with the runtime's images
}

// NewGuard returns the enforcer of policy over store; rt reaches the
// runtime directly, around the interceptors.
func NewGuard(store RecordStore, policy Policy, rt Runtime, opts GuardOptions) (*Guard, error) {
	g := &Guard{
		grants: newGrantTable(), refs: newRefLocks(),
		clock: opts.Clock, grace: opts.GracePeriod, pods: opts.Pods, accounts: opts.Accounts,
	}
	leftover, err := g.Decider.init(store, policy, rt, opts.Logger)
	if err != nil {
		return nil, err
	}
	g.setLeftover(leftover)
	if g.clock == nil {
		g.clock = clock.RealClock{}
	}
	g.Decider.now = g.clock.Now
	if g.grace <= 0 {
		g.grace = 10 * time.Minute
	}
	ttl := opts.HideTTL
	if ttl <= 0 {
		ttl = 2 * time.Minute
	}
	g.hidden = newHideTable(ttl, 10000)
	g.metrics, err = newMetrics(opts.Registerer, func() (int, int) {
		r, i, err := store.Counts()
		if err != nil {
			return -1, -1
		}
		return r, i
	}, g.grants.size, func() bool { return g.RecordsAvailable() == nil })
	if err != nil {
		return nil, err
	}
	return g, nil
}

// decision is the outcome of a must-verify check.
type decision struct {
	verify bool
	result string // the kubelet's result name
	rule   string // why, for the decision log and explain
}

// decide is the kubelet's MustAttemptImagePull without the pod: whether
// using the present image imageRef as repository repo ("" when unknown)
// requires the pod to prove a credential.
//
// Unlike the kubelet, "pulled by the proxy" is decided per repository when
// the repository is known: a digest pulled with a secret through repository
// X does not make a preloaded copy under Y need verification
// (kubernetes/kubernetes#138175). Knowing a repository requires the runtime
// to list the image under it; lookups by image ID never know one.
func (g *Guard) decide(imageRef, repo string) decision {
	d := g.decideNoMetrics(imageRef, repo)
	g.metrics.checks.WithLabelValues(d.result).Inc()
	return d
}

func (g *Decider) decideNoMetrics(imageRef, repo string) decision {
	if imageRef == "" {
		return decision{true, resultMustAuth, "no image ID"}
	}
	policy := g.Policy()
	rec, err := g.store.Get(imageRef)
	if err != nil && !errors.Is(err, ErrNotFound) {
		// The record is unknown: decide as if the image had been pulled
		// with credentials, the case that needs the most.
		if !policy.VerificationRequired(repo, true) {
			return decision{false, resultPolicyAllowed, policy.WhyNot(repo)}
		}
		if !errors.Is(err, ErrRecordsUnavailable) { // said once, at start
			g.log.Error("reading the image's record failed; it needs verification", "image", imageRef, "err", err)
		}
		return decision{true, resultError, "the record cannot be read: " + err.Error()}
	}
	var mapping *imagePullCredentials
	if rec != nil && repo != "" {
		if c, ok := rec.CredentialMapping[repo]; ok {
			mapping = &c
		}
	}
	pulled := g.pending.has(repo) || (rec != nil && (repo == "" || mapping != nil)) || (rec == nil && g.unrecorded.has(imageRef))
	if !policy.VerificationRequired(repo, pulled) {
		return decision{false, resultPolicyAllowed, policy.WhyNot(repo)}
	}
	if rec == nil {
		return decision{true, resultMustAuth, "no record of a verified pull"}
	}
	if repo == "" {
		if g.unrecorded.has(imageRef) {
			return decision{true, resultMustAuth, "repository unknown (a lookup by ID) and a pull of the image could not be recorded"}
		}
		for r, c := range rec.CredentialMapping {
			if !c.NodePodsAccessible {
				return decision{true, resultMustAuth, "repository unknown (a lookup by ID) and some repository of the image is restricted"}
			}
			if ok, why := g.fresh(imageRef, r, "node"); !ok {
				return decision{true, resultMustAuth, "repository unknown (a lookup by ID) and " + r + " was " + why}
			}
		}
		if len(rec.CredentialMapping) == 0 {
			return decision{true, resultMustAuth, "the record has no repository"}
		}
		return decision{false, resultRecordFound, "every repository of the image is accessible to all pods of the node"}
	}
	switch {
	case mapping == nil:
		return decision{true, resultMustAuth, "no verified pull as " + repo}
	case mapping.NodePodsAccessible:
		if ok, why := g.fresh(imageRef, repo, "node"); !ok {
			return decision{true, resultMustAuth, repo + " was pulled anonymously or with node credentials, " + why}
		}
		return decision{false, resultRecordFound, repo + " was pulled anonymously or with node credentials"}
	}
	return decision{true, resultMustAuth, repo + " was pulled with credentials"}
}

type (
	imagePullCredentials = kubeletconfigv1beta1.ImagePullCredentials
	kubeletSecret        = kubeletconfigv1beta1.ImagePullSecret
)

func orUnknown(repo string) string {
	if repo == "" {
		return "(unknown repository)"
	}
	return repo
}

// verified reports whether the request's credential (its salted hash,
// "" for none) is already verified for imageRef as repo. A pod's other
// secrets and its service account are the business of entitled.
func (g *Decider) verified(imageRef, repo, hash string) (bool, string) {
	rec, err := g.store.Get(imageRef)
	if err != nil {
		return false, "no readable record"
	}
	c, ok := rec.CredentialMapping[repo]
	if !ok {
		return false, "no verified pull as " + repo
	}
	switch {
	case hash != "" && slices.ContainsFunc(c.KubernetesSecrets, func(s kubeletSecret) bool { return s.CredentialHash == hash }):
		if ok, why := g.fresh(imageRef, repo, "h:"+hash); !ok {
			return false, "the request's credential was " + why
		}
		return true, "the request's credential was verified for " + repo
	case hash == "" && c.NodePodsAccessible:
		if ok, why := g.fresh(imageRef, repo, "node"); !ok {
			return false, repo + " was " + why
		}
		return true, repo + " is accessible to all pods of the node"
	}
	return false, "the request's credential was never verified for " + repo
}

// repoMayNeedVerification reports, from memory only, whether an image
// listed as repo may need verification: it errs towards true.
func (g *Decider) repoMayNeedVerification(repo string) bool {
	return g.Policy().MayNeedVerification(repo, g)
}

func (g *Decider) pullInFlight(repo string) bool { return g.pending.has(repo) }
func (g *Decider) restricted(repo string) bool   { return g.store.Restricted(repo) }

// parse is imageref's parse of image, remembered: the same few names
// come back on every kubelet sync, and parsing one costs microseconds.
func (g *Decider) parse(image string) imageref.Name { return g.names.Parse(image) }

// repository is imageref.Repository, remembered.
func (g *Decider) repository(image string) (string, bool) {
	n := g.names.Parse(image)
	return n.Repository, n.OK
}

// listedAs reports whether the runtime lists an image under repository
// repo, given the lists of names it lists it under: only then did a lookup
// by name really find it by that name (containerd also resolves a name
// that is an ID prefix).
func (g *Decider) listedAs(repo string, names ...[]string) bool {
	for _, list := range names {
		for _, r := range list {
			if name, ok := g.repository(r); ok && name == repo {
				return true
			}
		}
	}
	return false
}

// resolve returns the image ID of q and the repository it is known under
// ("" when it cannot be told), asking the runtime itself; "" when absent.
func (g *Decider) resolve(ctx context.Context, q ImageQuery) (ref, repo string, err error) {
	img, ok, err := g.runtime.Image(ctx, q)
	if err != nil || !ok {
		return "", "", err
	}
	for _, name := range []string{q.UserSpecified, q.Name} {
		if r, ok := g.repository(name); ok && g.listedAs(r, img.Names) {
			return img.ID, r, nil
		}
	}
	return img.ID, "", nil
}

func describe(c Credential) string {
	switch {
	case c.Node:
		return "anonymous or node credentials: accessible to all pods of the node"
	case c.ServiceAccount != nil:
		return "service account " + c.ServiceAccount.Namespace + "/" + c.ServiceAccount.Name
	}
	return "a credential of the request, checked by the registry"
}

// logDecision writes the decision log line, at debug level. It never
// holds a secret: images, pods and rules only.
func (g *Decider) logDecision(ctx context.Context, what, image, imageRef, pod, rule string) {
	if g.log.Enabled(ctx, slog.LevelDebug) {
		g.log.DebugContext(ctx, "ensure decision", "decision", what, "image", image, "imageRef", imageRef, "pod", pod, "rule", rule)
	}
}

// DropGrants drops every pod's in-memory grant of imageRef: its pods
// re-check at their next container start (records revoke, forget).
func (g *Guard) DropGrants(imageRef string) { g.grants.dropImage(imageRef) }

// ResolveImage returns the image ID of a name, as the runtime answers it;
// an error when the image is not present.
func (g *Decider) ResolveImage(ctx context.Context, image string) (string, error) {
	ref, _, err := g.resolve(ctx, ImageQuery{Name: image})
	if err != nil {
		return "", err
	}
	if ref == "" {
		return "", fmt.Errorf("image %s is not present", image)
	}
	return ref, nil
}
