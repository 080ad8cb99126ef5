package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Decider is the enforcer's core: what the records, the policy, the
// runtime and the pulls in flight say of an image, with no CRI types. Its
// own state is what decisions need between reads: the pulls in flight per
// repository, the images whose record could not be written, parsed names.
// The Guard is a Decider plus
// the CRI path's state (grants, hides, the pods of the node, metrics);
// records explain, with no daemon running, uses a Decider alone.
type Decider struct {
	store RecordStore
	// policy is swapped whole by SetPolicy (a reload); a decision reads it
	// once.
	policy atomic.Pointer[policyRef]
	// expiry (optional) bounds the re-use of verified credentials; swapped
	// whole by SetExpiry.
	expiry atomic.Pointer[expiryRef]
	now    func() time.Time
	// futureLogged says a verification time in the future was reported:
	// once is enough to send the operator to the clock.
	futureLogged atomic.Bool
	runtime      Runtime
	// pending counts pulls in flight per repository, intents a crash left
	// included: their images are never taken for preloaded ones.
	pending *pendingTable
	// unrecorded are images pulled through the proxy whose record could
	// not be written: until a restart settles their intents, they count as
	// pulled with no verified credential (see Pull).
	unrecorded *pendingTable
	log        *slog.Logger
	// names remembers parsed image names.
	names imageref.Names
}

// policyRef boxes a Policy for atomic.Pointer.
type policyRef struct{ decision.Policy }

// Policy returns the policy decisions are made under now.
func (d *Decider) Policy() decision.Policy { return d.policy.Load().Policy }

// SetPolicy makes p the policy of the next decisions (a reload of the
// configuration); decisions already under way finish under the old one.
func (d *Decider) SetPolicy(p decision.Policy) { d.policy.Store(&policyRef{p}) }

// DeciderOptions are NewDecider's.
type DeciderOptions struct {
	// Expiry bounds the re-use of verified credentials (the records'
	// maximum age); nil: records never expire.
	Expiry *decision.Expiry
}

// NewDecider returns the core over store, policy and rt, for decisions
// outside the daemon (records explain): the intents on disk count as pulls
// in flight, as they do in a daemon that has not settled them yet.
func NewDecider(store RecordStore, policy decision.Policy, rt Runtime, opts DeciderOptions) (*Decider, error) {
	d := &Decider{}
	if _, err := d.init(store, policy, rt, nil); err != nil {
		return nil, err
	}
	d.SetExpiry(opts.Expiry)
	return d, nil
}

// init sets d up and returns the intents found on disk, each counted as a
// pull in flight of its repository.
func (d *Decider) init(store RecordStore, policy decision.Policy, rt Runtime, log *slog.Logger) ([]Intent, error) {
	d.store, d.runtime, d.log = store, rt, log
	d.SetPolicy(policy)
	if d.now == nil {
		d.now = time.Now
	}
	d.pending, d.unrecorded = newPendingTable(), newPendingTable()
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	leftover, err := store.Intents()
	if err != nil {
		return nil, fmt.Errorf("reading pull intents: %w", err)
	}
	for _, in := range leftover {
		if repo, ok := imageref.Repository(in.Image); ok {
			d.pending.inc(repo)
		}
	}
	return leftover, nil
}

// mustVerify is the outcome of a must-verify check.
type mustVerify struct {
	verify bool
	result string // the kubelet's result name
	rule   string // why, for the decision log and explain
}

// decide is the kubelet's MustAttemptImagePull without the pod: whether
// using the present image imageRef as repository repo ("" when unknown)
// requires the pod to prove a credential. name is the name the pod asked
// for (imageref.Name.Lookup form; "" for a lookup by ID), listed under the
// image whenever repo is set.
//
// Unlike the kubelet, "pulled by the proxy" is decided per repository when
// the repository is known: a digest pulled with a secret through repository
// X does not make a preloaded copy under Y need verification
// (https://github.com/kubernetes/kubernetes/issues/138175). Knowing a repository requires the runtime
// to list the image under it; lookups by image ID never know one.
//
// A name the image was listed under before the proxy first recorded a pull
// of it (its preloaded names, kept with that record) stays preloaded, for
// every pod: the image was on the node, free by that name, and refusing it
// later protects nothing. This is what the kubelet's ImagePreloadedRecord
// does (https://github.com/kubernetes/kubernetes/pull/139156), by full name rather than by
// repository, so that it also holds within one repository: a preloaded
// base:node stays free after tenant A pulls base:v1 of the same digest
// with its secret, while base:v1 stays A's (it is no preloaded name). A
// pull in flight changes nothing for such a name: the image it names is
// the one that was free. Policies decide with it as with any image the
// proxy never pulled (VerificationRequired(repo, false)): free under
// NeverVerifyPreloadedImages, the allowlist alone under
// NeverVerifyAllowlistedImages and verified under AlwaysVerify, as they
// treat preloaded images (the kubelet's policies ignore "preloaded" but
// for the first).
//
// A lookup by ID (kubelets before 1.28 create containers by image ID
// alone) of an image with preloaded names is decided as the kubelet
// decides a preloaded image: the image was free to every pod before its
// first recorded pull (by those names, so by its ID too), and its ID
// names those very bytes, nothing a later pull brought. An image that came
// through the proxy first has no preloaded names, whatever names appear
// on it later (a tag added around the proxy, another preload of the same
// digest): by ID it is decided by its record, as before, and by name per
// repository, as above.
func (d *Decider) decide(imageRef, repo, name string, names []string) mustVerify {
	if imageRef == "" {
		return mustVerify{true, resultMustAuth, "no image ID"}
	}
	policy := d.Policy()
	if pre := d.store.Preloaded(imageRef); len(pre) > 0 && !policy.VerificationRequired(repo, false) {
		switch {
		case repo == "":
			return mustVerify{false, resultPolicyAllowed, "preloaded: the image was on the node, free to all pods, before the proxy first pulled it (listed as " + strings.Join(pre, ", ") + ")"}
		case name != "" && slices.Contains(pre, name):
			return mustVerify{false, resultPolicyAllowed, "preloaded: listed as " + name + " before the proxy first pulled the image"}
		}
	}
	rec, err := d.store.Get(imageRef)
	if err != nil && !errors.Is(err, ErrNotFound) {
		// The record is unknown: decide as if the image had been pulled
		// with credentials, the case that needs the most.
		if !policy.VerificationRequired(repo, true) {
			return mustVerify{false, resultPolicyAllowed, policy.WhyNot(repo)}
		}
		if !errors.Is(err, ErrRecordsUnavailable) { // said once, at start
			d.log.Error("reading the image's record failed; it needs verification", "image", imageRef, "err", err)
		}
		return mustVerify{true, resultError, "the record cannot be read: " + err.Error()}
	}
	var mapping *imagePullCredentials
	if rec != nil && repo != "" {
		if c, ok := rec.CredentialMapping[repo]; ok {
			mapping = &c
		}
	}
	pulled := d.pending.has(repo) || (rec != nil && (repo == "" || mapping != nil)) ||
		(rec == nil && (d.unrecorded.has(imageRef) || repo == "" && d.pulledAsListed(names)))
	if !policy.VerificationRequired(repo, pulled) {
		return mustVerify{false, resultPolicyAllowed, policy.WhyNot(repo)}
	}
	if rec == nil {
		return mustVerify{true, resultMustAuth, "no record of a verified pull"}
	}
	if repo == "" {
		if d.unrecorded.has(imageRef) {
			return mustVerify{true, resultMustAuth, "repository unknown (a lookup by ID) and a pull of the image could not be recorded"}
		}
		for r, c := range rec.CredentialMapping {
			if !c.NodePodsAccessible {
				return mustVerify{true, resultMustAuth, "repository unknown (a lookup by ID) and some repository of the image is restricted"}
			}
			if ok, why := d.fresh(imageRef, r, records.NodeKey); !ok {
				return mustVerify{true, resultMustAuth, "repository unknown (a lookup by ID) and " + r + " was " + why}
			}
		}
		if len(rec.CredentialMapping) == 0 {
			return mustVerify{true, resultMustAuth, "the record has no repository"}
		}
		return mustVerify{false, resultRecordFound, "every repository of the image is accessible to all pods of the node"}
	}
	switch {
	case mapping == nil:
		return mustVerify{true, resultMustAuth, "no verified pull as " + repo}
	case mapping.NodePodsAccessible:
		if ok, why := d.fresh(imageRef, repo, records.NodeKey); !ok {
			return mustVerify{true, resultMustAuth, repo + " was pulled anonymously or with node credentials, " + why}
		}
		return mustVerify{false, resultRecordFound, repo + " was pulled anonymously or with node credentials"}
	}
	if len(mapping.KubernetesSecrets) == 0 && len(mapping.KubernetesServiceAccounts) == 0 {
		// Recorded with no credential: a pull that failed, was cut or was
		// aborted left it (anonymous or not), unverified by the registry.
		return mustVerify{true, resultMustAuth, repo + " arrived by a pull the registry did not verify (failed, cut or aborted)"}
	}
	return mustVerify{true, resultMustAuth, repo + " was pulled with credentials"}
}

type (
	imagePullCredentials = kubeletconfigv1beta1.ImagePullCredentials
	kubeletSecret        = kubeletconfigv1beta1.ImagePullSecret
)

// verified reports whether the request's credential (its salted hash,
// "" for none) is already verified for imageRef as repo. A pod's other
// secrets and its service account are the business of entitled.
func (d *Decider) verified(imageRef, repo, hash string) (bool, string) {
	rec, err := d.store.Get(imageRef)
	if err != nil {
		return false, "no readable record"
	}
	c, ok := rec.CredentialMapping[repo]
	if !ok {
		return false, "no verified pull as " + repo
	}
	switch {
	case hash != "" && slices.ContainsFunc(c.KubernetesSecrets, func(s kubeletSecret) bool { return s.CredentialHash == hash }):
		if ok, why := d.fresh(imageRef, repo, records.HashKey(hash)); !ok {
			return false, "the request's credential was " + why
		}
		return true, "the request's credential was verified for " + repo
	case hash == "" && c.NodePodsAccessible:
		if ok, why := d.fresh(imageRef, repo, records.NodeKey); !ok {
			return false, repo + " was " + why
		}
		return true, repo + " is accessible to all pods of the node"
	}
	return false, "the request's credential was never verified for " + repo
}

// repoMayNeedVerification reports, from memory only, whether an image
// listed as repo may need verification: it errs towards true. Where a
// maximum record age applies to repo, any record of it may have expired,
// a node-wide one included (the restricted index does not count those):
// the call is decided, so that ImageStatus hides what CreateContainer
// would refuse.
func (d *Decider) repoMayNeedVerification(repo string) bool {
	policy := d.Policy()
	if policy.MayNeedVerification(repo, deciderMemory{d}) {
		return true
	}
	return d.Expiry().MaxAge(repo) > 0 && policy.VerificationRequired(repo, true)
}

// deciderMemory is the Decider's memory as a policy reads it.
type deciderMemory struct{ d *Decider }

func (m deciderMemory) PullInFlight(repo string) bool { return m.d.pending.has(repo) }
func (m deciderMemory) Restricted(repo string) bool   { return m.d.restricted(repo) }

func (d *Decider) restricted(repo string) bool { return d.store.Restricted(repo) }

// parse is imageref's parse of image, remembered: the same few names
// come back on every kubelet sync, and parsing one costs microseconds.
func (d *Decider) parse(image string) imageref.Name { return d.names.Parse(image) }

// repository is imageref.Repository, remembered.
func (d *Decider) repository(image string) (string, bool) {
	n := d.names.Parse(image)
	return n.Repository, n.OK
}

// listedAs reports whether the runtime lists an image under repository
// repo, given the lists of names it lists it under: only then did a lookup
// by name really find it by that name (containerd also resolves a name
// that is an ID prefix).
func (d *Decider) listedAs(repo string, names ...[]string) bool {
	return crireq.ListedAs(&d.names, repo, names...)
}

// resolve returns the image q names, as the runtime itself answers (a
// zero Image when absent), and the repository it is known under: "" when
// it cannot be told (a lookup by ID, or a name the image is not listed
// under).
func (d *Decider) resolve(ctx context.Context, q crireq.ImageQuery) (crireq.Image, string, error) {
	return crireq.Resolve(ctx, d.runtime, &d.names, q)
}

// askedName is the name of q the image was found by as repo (Lookup
// form), "" when repo is unknown (a lookup by ID): the name decide checks
// against the image's preloaded names.
func (d *Decider) askedName(q crireq.ImageQuery, repo string) string {
	if repo == "" {
		return ""
	}
	for _, name := range []string{q.UserSpecified, q.Name} {
		if n := d.parse(name); n.OK && n.Repository == repo {
			return n.Lookup()
		}
	}
	return ""
}

// pulledAsListed reports whether a pull through the proxy is in flight, or
// its outcome unsettled, for a repository the image is listed under: an
// image with no record found by ID is then not taken for a preloaded one.
func (d *Decider) pulledAsListed(names []string) bool {
	for _, n := range names {
		if r, ok := d.repository(n); ok && d.pending.has(r) {
			return true
		}
	}
	return false
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
func (d *Decider) logDecision(ctx context.Context, what, image, imageRef, pod, rule string) {
	if d.log.Enabled(ctx, slog.LevelDebug) {
		d.log.DebugContext(ctx, "ensure decision", "decision", what, "image", image, "imageRef", imageRef, "pod", pod, "rule", rule)
	}
}

// ResolveImage returns the image ID of a name, as the runtime answers it;
// an error when the image is not present.
func (d *Decider) ResolveImage(ctx context.Context, image string) (string, error) {
	img, _, err := d.resolve(ctx, crireq.ImageQuery{Name: image})
	if err != nil {
		return "", err
	}
	ref := img.ID
	if ref == "" {
		return "", fmt.Errorf("image %s is not present", image)
	}
	return ref, nil
}

// PruneRecords drops the records of images the runtime no longer lists,
// last updated before until: the records part of GC, for a records gc run
// with no daemon (the daemon settles the intents on disk at its start).
func (d *Decider) PruneRecords(ctx context.Context, until time.Time) (int, error) {
	images, err := d.runtime.Images(ctx)
	if err != nil {
		return 0, fmt.Errorf("gc: list images: %w", err)
	}
	return d.prune(images, until)
}

func (d *Decider) prune(images []crireq.Image, until time.Time) (int, error) {
	present := make(map[string]bool, len(images))
	for _, img := range images {
		present[img.ID] = true
	}
	n, err := d.store.Prune(func(ref string) bool { return present[ref] }, until)
	if err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	return n, nil
}

// imageID returns the image ID a pull's image_ref stands for: the
// ref itself when it is an ID (containerd), else what the runtime answers
// for the name (a runtime that answers a repo digest). When it cannot be
// told, the ref is kept: a record under it can only be missed, never
// match another image.
func (d *Decider) imageID(ctx context.Context, name, ref string) string {
	return crireq.ImageID(ctx, d.runtime, name, ref)
}

// RecordsAvailable returns nil when the guard's records database is
// usable, and otherwise why not: a readiness check and a metric report it.
func (d *Decider) RecordsAvailable() error {
	if u, ok := d.store.(interface{ Unavailable() error }); ok {
		return u.Unavailable()
	}
	return nil
}
