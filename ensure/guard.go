package ensure

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/layerprivacy"
)

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
	// Registry asks an image's own registry for its word on a pull's
	// credential (Verify, for each try of a pull): a pull is recorded for
	// a credential only with that word. nil only in tests of the rest:
	// then the runtime's success stands for it.
	Registry RegistryCheck
	// Credentials runs a pull's tries with credential injection's
	// credentials after the request's own; nil: the request's own only.
	Credentials Credentials
	// Manifests reads a manifest from the runtime's store while its pull
	// runs (containerd's content API), so that the registry check asks for
	// the config beside the pull; nil: after it.
	Manifests RuntimeManifests
	// Accounts re-checks service-account re-uses against the token plugins
	// as they are now; nil means none are configured, and a pull recorded
	// for a service account is then never re-used.
	Accounts AccountCheck
	// ImagePolicy, when set, decides each try of a pull on the digest the
	// registry resolved (Verify), and each image a container would see
	// (Admit), after ensure's own decision. nil: no image policy.
	ImagePolicy ImagePolicy
	// Expiry bounds the re-use of verified credentials from the start
	// (SetExpiry changes it later); nil: records never expire.
	Expiry *decision.Expiry
}

// Guard is the set of CRI hooks that enforce the policy. It is safe for
// concurrent use. It is made of three parts over one Decider: the CRI
// path's hooks and the daemon's lifecycle here, the pull path (pulls:
// pull.go, verify.go) and the keeper of every end's facts (ledger:
// settle.go, intents.go, and layers.go: the arrivals and the looks at the
// node).
type Guard struct {
	// Decider is the core the CRI path shares with records explain: the
	// records, the policy, the runtime and the pulls in flight.
	Decider
	pulls  *puller
	ledger *ledger

	grants *grantTable
	// writes follows the records database's writes (the store is wrapped).
	writes *writeHealth
	// verifications are the registry's last words, for records explain
	// (the pull path notes them).
	verifications *verificationTable
	hidden        *hideTable
	// refs order a pull's record against RemoveImage's forget.
	refs *refLocks
	// layers decide which layers of the node are private; they hold the
	// pulls in flight, the images whose layers are unknown and whether the
	// node was observed.
	layers *layerprivacy.Node
	// removals are the images RemoveImage forgot, for the pulls under way.
	removals *removalTable
	metrics  *metrics
	clock    clock.PassiveClock
	grace    time.Duration
	// entitlements decide by a pod's pull secrets and service account.
	entitlements *entitlements
	// imagePolicy is noImagePolicy without an image policy.
	imagePolicy ImagePolicy

	// kept are the intents not settled yet: a crash's, found at start
	// (until Recover settles them), and those kept in this life.
	kept *keptIntents
}

// NewGuard returns the enforcer of policy over store; rt reaches the
// runtime directly, around the interceptors.
func NewGuard(store RecordStore, policy decision.Policy, rt Runtime, opts GuardOptions) (*Guard, error) {
	g := &Guard{
		grants: newGrantTable(), refs: newRefLocks(), removals: newRemovalTable(), kept: &keptIntents{},
		clock: opts.Clock, grace: opts.GracePeriod, imagePolicy: opts.ImagePolicy,
	}
	if g.imagePolicy == nil {
		g.imagePolicy = noImagePolicy{}
	}
	g.entitlements = &entitlements{pods: opts.Pods, accounts: opts.Accounts, d: &g.Decider}
	g.writes = &writeHealth{}
	g.verifications = newVerificationTable(4096)
	leftover, err := g.Decider.init(watchedStore{store, g.writes}, policy, rt, opts.Logger)
	if err != nil {
		return nil, err
	}
	g.kept.pending = g.pending
	g.kept.setLocked(leftover)
	g.SetExpiry(opts.Expiry)
	if g.clock == nil {
		g.clock = clock.RealClock{}
	}
	g.Decider.now = g.clock.Now
	g.layers = layerprivacy.New(g.store, g.runtime, g.unrecorded.has, g.clock.Now, g.log)
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
	}, g.grants.size, func() bool { return g.RecordsAvailable() == nil }, func() bool { return g.RecordsWritable() == nil }, g.layers.Observation.Observed)
	if err != nil {
		return nil, err
	}
	g.ledger = &ledger{Decider: &g.Decider, layers: g.layers, kept: g.kept, refs: g.refs, removals: g.removals, metrics: g.metrics, clock: g.clock}
	g.pulls = &puller{
		Decider: &g.Decider, ledger: g.ledger, layers: g.layers, hidden: g.hidden, grants: g.grants, entitlements: g.entitlements,
		metrics: g.metrics, clock: g.clock, imagePolicy: g.imagePolicy,
		registry: opts.Registry, credentials: opts.Credentials, manifests: opts.Manifests, verifications: g.verifications,
	}
	return g, nil
}

// countedDecide is the Decider's decide, counted in the metrics.
func (g *Guard) countedDecide(imageRef, repo, name string, names []string) mustVerify {
	d := g.decide(imageRef, repo, name, names)
	g.metrics.checks.WithLabelValues(d.result).Inc()
	return d
}

// DropGrants drops every pod's in-memory grant of imageRef: its pods
// re-check at their next container start (records revoke, forget).
func (g *Guard) DropGrants(imageRef string) { g.grants.dropImage(imageRef) }
