package ensure

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/layerprivacy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// ledger keeps the facts every end leaves on the node, in one place: a
// pull's end (settle), the intents kept until their outcome is known
// (intents.go: a crash's, a cut pull's), and an image that arrived around
// the proxy (track, arrivedAroundTheProxy and the looks at the node in
// layers.go). It owns no table of its own: it writes the records, the
// kept intents and the layers the Guard shares, under the image locks
// RemoveImage takes too.
type ledger struct {
	*Decider // the records, the runtime, the pulls in flight, the log
	layers   *layerprivacy.Node
	kept     *keptIntents
	refs     *refLocks
	removals *removalTable
	metrics  *metrics
	clock    clock.PassiveClock
}

// A pull through the proxy ends in one of the ways below, and settle is
// the one place each end's facts are kept. Every end keeps the same
// three: the record of the image the name now stands for (the verified
// credential, or none: tracked, every pod verifies) or, when what the
// runtime holds is not known yet, the pull's intent; that image's layers,
// learnt from the runtime, else marked unknown (a holder whose layers are
// unknown makes every layer it may hold private until they are learnt);
// and the names it was free by before (preloaded), only for an image
// with no record yet, on a node the proxy has observed.
//
// Two more ends are settled where they are found, with the same facts:
// an intent left by a crash (settleLocked, at start and at each GC run),
// and an image that arrived around the proxy (track).
type pullEnd int

const (
	// endVerified: the registry verified a try's credential, and the
	// runtime holds the image it named (pulled, or already on the node).
	endVerified pullEnd = iota
	// endRefused: the registry refused every try's credential, or could
	// not be asked, or answered another image than the runtime's.
	endRefused
	// endPolicyRefused: the image policy refused the digest the registry
	// named, before the runtime was asked.
	endPolicyRefused
	// endFailed: the runtime's own error ended the last try.
	endFailed
	// endStopped: the proxy stopped a try's runtime pull before it
	// answered (a refusal that came while the runtime pulled). The
	// runtime may go on and create the image after its client's cancel,
	// so this is a cut pull.
	endStopped
	// endCut: the caller went away before the runtime answered.
	endCut
)

func (e pullEnd) String() string {
	return [...]string{"verified", "refused", "refused by policy", "failed", "stopped by the proxy", "cut"}[e]
}

// pullRun is one pull through the proxy, across its tries (they run one
// after the other): what it is of, and what its tries found.
type pullRun struct {
	image string
	repo  string
	pod   crireq.Pod
	// intent is the pull's durable intent, written before the runtime is
	// first asked ("" until then: a pull answered from the node has none).
	intent string
	// before is the image the name stood for before the pull ("" when
	// absent or not known); began is when the pull asked.
	before string
	began  time.Time
	// flight holds the pull's layers for the other pulls in flight.
	flight *layerprivacy.Flight
	// stopped says a try's runtime pull was stopped, by the proxy or its
	// caller, before the runtime answered: what it leaves is not known
	// until the runtime is asked again later.
	stopped bool
	// verified is the registry's word on the try that succeeded.
	verified *RegistryVerification
}

// keptSince is when the pull began, for an intent kept because a try's
// runtime pull was cut short (the zero time otherwise).
func (run *pullRun) keptSince() time.Time {
	if run.stopped {
		return run.began
	}
	return time.Time{}
}

// endOf names how a pull that failed with err ended.
func endOf(ctx context.Context, run *pullRun, err error) pullEnd {
	switch {
	case ctx.Err() != nil:
		return endCut
	case run.stopped:
		return endStopped
	case errors.As(err, new(policyRefusal)):
		return endPolicyRefused
	case errors.Is(err, registry.ErrDenied), errors.Is(err, registry.ErrMoved), errors.Is(err, registry.ErrUnreachable), errors.Is(err, errNotVerified):
		return endRefused
	}
	return endFailed
}

// settleTimeout bounds the questions settling a pull asks the runtime.
const settleTimeout = 10 * time.Second

// settle keeps the facts of a pull's end. For endVerified, pulled is the
// runtime's image reference and cred the credential the registry
// verified; for any other end, the runtime is asked what the name stands
// for now, with a context of the proxy's own (the caller's may be gone):
//   - a new image (not the one before the pull): recorded as pulled with
//     no verified credential, so every pod verifies, never taken for a
//     preloaded one;
//   - nothing new, and the runtime's last word on every try is known
//     (it answered, or was never asked): the intent goes;
//   - nothing new yet, but a try's runtime pull was stopped or cut
//     before it answered: the runtime may still be finishing it
//     (containerd goes on after its client's cancel and creates the image
//     a moment after this question), so the intent is kept;
//   - no answer: the intent is kept.
//
// A kept intent counts as a pull in flight of its repository until a GC
// run finds its image (then recorded as above), a later pull of the name
// succeeds, or the next start settles it. It returns the image ID the
// end left the name standing for ("" when none or not known), and whether
// the verified credential was recorded.
func (l *ledger) settle(ctx context.Context, run *pullRun, end pullEnd, pulled string, cred Credential) (string, bool) {
	// Only a runtime's pull cut short leaves the runtime's word unknown: a
	// pull cut before the runtime was asked, or after it answered, left
	// what the runtime says now.
	cut := run.stopped
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var id string
	if end == endVerified {
		id = l.imageID(ctx, run.image, pulled)
	} else {
		cred = Credential{}
		var arrived bool
		if id, arrived = l.arrived(ctx, run, end); !arrived {
			return "", false
		}
	}
	// What was on the node before decides the preloaded names: a look under
	// way is waited for before the image's lock is taken.
	l.layers.Observation.Await(ctx)
	unlock := l.refs.lock(id)
	preloaded := l.namesBeforePull(ctx, run, id)
	if end == endVerified && run.intent == "" && !cut && l.verifiedRecently(id, run.repo, cred) {
		// Answered from the node on the registry's word, for a credential
		// the record holds and verified a moment ago: nothing to write (a
		// write is two fsyncs, most of a re-checked pull's cost). A
		// verification time refreshed at most that often only errs towards
		// an earlier expiry.
		unlock()
		return id, true
	}
	err := l.recordEnd(ctx, run, end, id, cred, preloaded)
	unlock()
	if err != nil {
		return id, false
	}
	if end == endVerified {
		// The record tracks what the name stands for: the intents earlier
		// pulls of it kept protect nothing more.
		l.settlePulled(ctx, run.image)
	}
	if cut {
		l.kept.keep(Intent{ID: run.intent, Image: run.image}, run.repo, run.keptSince())
	}
	if end == endVerified {
		return id, true
	}
	l.logDecision(ctx, "PullImage: "+end.String()+", but the image arrived: tracked with no verified credential", run.image, id, run.pod.String(), "every pod verifies")
	return id, false
}

// arrived asks the runtime what a pull that ended unverified left: the
// image the name now stands for when it is new (not the one before the
// pull). Otherwise it settles the pull's intent here, and says false:
// dropped when the runtime's last word on every try is known, kept while
// it is not (a try stopped or cut before it answered, or no answer now).
func (l *ledger) arrived(ctx context.Context, run *pullRun, end pullEnd) (string, bool) {
	keep := Intent{ID: run.intent, Image: run.image}
	img, present, err := l.runtime.Image(ctx, crireq.ImageQuery{Name: run.image})
	switch {
	case err != nil:
		l.kept.keep(keep, run.repo, run.keptSince())
		l.log.Warn("a pull ended and the runtime cannot say what it left; its intent is kept until it can", "image", run.image, "end", end.String(), "err", err)
		return "", false
	case present && img.ID != run.before:
		return img.ID, true
	case run.stopped:
		l.kept.keep(keep, run.repo, run.keptSince())
		l.log.Info("a pull was stopped before the runtime said it finished; its intent is kept", "image", run.image, "end", end.String(), "settledBy", "a GC run or a pull of the image")
	case run.intent == "":
		// The runtime was never asked: nothing was noted.
	default:
		if err := l.store.DropIntent(run.intent); err != nil {
			l.kept.keep(keep, run.repo, time.Time{})
			l.log.Warn("dropping a pull intent failed; it is kept until a GC run settles it", "image", run.image, "err", err)
		}
	}
	return "", false
}

// recordEnd writes the record of the image id a pull's end left, under
// id's lock: the verified credential cred (none for another end), the
// image's layers (the registry's with the record, else learnt from the
// runtime or marked unknown) and its preloaded names, in one transaction
// with the intent's removal, unless a try was cut (the runtime's last
// word not known: the intent stays).
func (l *ledger) recordEnd(ctx context.Context, run *pullRun, end pullEnd, id string, cred Credential, preloaded []string) error {
	intent := run.intent
	if run.stopped {
		// The runtime's last word on a stopped try is not known: whatever
		// it creates later must not pass for preloaded. The record is
		// written; the intent stays until it is settled.
		intent = ""
	}
	verified := end == endVerified && run.verified != nil && run.verified.LayersKnown
	var err error
	if verified {
		// The registry vouched for every layer as repo: kept with the record.
		err = l.store.RecordVerifiedPull(id, run.repo, cred, run.verified.Layers, intent, l.clock.Now(), preloaded)
	} else {
		err = l.store.RecordPull(id, run.repo, cred, intent, l.clock.Now(), preloaded)
	}
	if err != nil || !verified {
		// Not kept with the record: learnt from the runtime, or marked
		// unknown (a record that failed restricts the image meanwhile).
		l.keepLayers(ctx, id, err != nil || !cred.Node)
	}
	if err != nil {
		l.recordFailed(run.image, run.repo, id, run.intent, err)
	}
	return err
}

// verifyRefresh is how often a re-check of a recorded credential rewrites
// its verification time. Where a maximum record age applies, a tenth of it
// is: an expired record is always older than that, so its new
// verification is always written (and the next pull re-uses it).
const verifyRefresh = time.Minute

// refreshWithin is the age under which a re-check of repo's credential is
// not rewritten.
func (l *ledger) refreshWithin(repo string) time.Duration {
	if max := l.Expiry().MaxAge(repo); max > 0 && max/10 < verifyRefresh {
		return max / 10
	}
	return verifyRefresh
}

// verifiedRecently reports whether the record of imageRef holds cred for
// repo, verified less than refreshWithin(repo) ago, with its layers known.
func (l *ledger) verifiedRecently(imageRef, repo string, cred Credential) bool {
	if _, ok := l.store.Layers(imageRef); !ok {
		return false
	}
	keys := records.CredentialKeys(cred)
	if len(keys) == 0 {
		return false
	}
	within := l.refreshWithin(repo)
	for _, k := range keys {
		at, ok, err := l.store.VerifiedAt(imageRef, repo, k)
		if err != nil || !ok || l.clock.Since(at) >= within || at.After(l.clock.Now()) {
			return false
		}
	}
	return true
}

// keepLayers learns the layers of an image an end left on the node, from
// the runtime. When the runtime does not say, and the image restricts (a
// record that is not node-wide, or one that could not be written), its
// layers are marked unknown: until they are learnt (a GC run asks again),
// every layer the node holds counts as one it may hold, and so as private
// (layerPrivate).
func (l *ledger) keepLayers(ctx context.Context, imageRef string, restricts bool) {
	if _, _, kept := l.layers.Learn(ctx, imageRef, l.clock.Now(), true); !kept && restricts {
		l.layers.Unknown.Add(imageRef, l.clock.Now())
		l.log.Warn("the runtime does not say which layers an image holds; every layer on the node counts as private until it does",
			"imageRef", imageRef)
	}
}

// recordFailed keeps a pull's intent whose record could not be written.
// Until a GC run (or the next start) settles it, as the kubelet's intent
// counter does, the image counts as pulled by the proxy with no verified
// credential, by its repository and by its ID: never as preloaded.
func (l *ledger) recordFailed(image, repo, ref, intent string, err error) {
	l.kept.keep(Intent{ID: intent, Image: image}, repo, time.Time{})
	l.unrecorded.inc(ref)
	l.metrics.recordErr.Inc()
	l.log.Error("recording a pull failed; every other pod verifies the image", "image", image, "imageRef", ref,
		"until", "its intent is settled", "err", err)
}

// removalTable remembers when images were removed through the proxy
// (RemoveImage forgot their records), for the pulls under way then.
type removalTable struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func newRemovalTable() *removalTable { return &removalTable{m: map[string]time.Time{}} }

func (r *removalTable) note(imageRef string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[imageRef] = at
}

// since reports whether imageRef was removed at t or later.
func (r *removalTable) since(imageRef string, t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.m[imageRef]
	return ok && !at.Before(t)
}

// gc forgets the removals before until: no pull runs that long.
func (r *removalTable) gc(until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ref, at := range r.m {
		if at.Before(until) {
			delete(r.m, ref)
		}
	}
}

// namesBeforePull returns the names the image ref, which a pull of image (of
// repository repo) just resolved to, was listed under before that pull,
// when ref has no record yet: it was on the node, free to every pod by
// those names, and they stay so (the store keeps them with the pull's
// record, as its preloaded names). Nil when ref has a record (the store
// would ignore them) or the runtime cannot say. The caller holds ref's
// lock, so no other pull through the proxy records ref meanwhile.
//
// The runtime answers with the names the image has now; those this pull,
// or another in flight, may have given it are left out, so that no name a
// tenant pulled with credentials passes for a preloaded one:
//   - image itself, unless it named ref before the pull (before);
//   - the digests of repo: the pull adds repo@manifest-digest, which a
//     preload from the same repository may have added already, and the
//     two cannot be told apart;
//   - every name of a repository with another pull through the proxy in
//     flight (or unsettled): it may have added it, and not recorded it yet.
//
// None at all when the image came around the proxy holding a layer that
// was private on the node before the proxy first saw it
// (cameWithPrivateLayers): it was never free, whatever its names.
//
// None either when the image was removed through the proxy since the pull
// began (its record, forgotten, may have been a tenant's), or before the
// proxy has observed the node (a look at its
// images that succeeded): what was there before cannot be told yet.
//
// What is left out needs verification, as an image without preloaded
// names does: the error is on the safe side. See decide for what the names then allow.
func (l *ledger) namesBeforePull(ctx context.Context, run *pullRun, ref string) []string {
	image, repo, before, fl := run.image, run.repo, run.before, run.flight
	if l.removals.since(ref, run.began) || !l.layers.Observation.Await(ctx) {
		return nil
	}
	if _, err := l.store.Get(ref); !errors.Is(err, ErrNotFound) || l.unrecorded.has(ref) {
		return nil // a record (readable or not), or a pull of it that could not record
	}
	img, ok, err := l.runtime.Image(ctx, crireq.ImageQuery{Name: ref})
	if err != nil || !ok || img.ID != ref {
		return nil
	}
	asked := l.parse(image).Lookup()
	var out []string
	for _, name := range img.Names {
		n := l.parse(name)
		own := 0
		if n.Repository == repo {
			own = 1 // this pull's own count
		}
		switch key := n.Lookup(); {
		case !n.OK:
		case key == asked && before != ref:
		case n.Repository == repo && strings.Contains(key, "@"):
		case l.pending.count(n.Repository) > own:
		default:
			out = append(out, key)
		}
	}
	if len(out) > 0 {
		if came, _ := l.layers.CameWithPrivateLayers(ctx, ref, fl); came {
			return nil
		}
	}
	return out
}
