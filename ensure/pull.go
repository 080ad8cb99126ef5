package ensure

import (
	"context"
	"errors"
	"fmt"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containerd/errdefs"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// Forward is the runtime's pull of one try: req carries the try's
// credential in Auth. It returns the image reference the runtime answered.
type Forward func(ctx context.Context, req *runtimeapi.PullImageRequest) (imageRef string, err error)

// Credentials is credential injection: the tries a pull goes with, the
// request's own credential first, then the node's for the image (the
// plugins'); *credplugins.Injector is the real one. Without it, a pull has
// the one try of the request's own credential (pullcred.Own).
type Credentials interface {
	Tries(req *runtimeapi.PullImageRequest) pullcred.Tries
}

// Pull answers a pull of req. Right after a hide, a pull whose credential
// (or whose pod, by its secrets or service account) is already verified
// for the image is answered from the node: its image ID, no registry
// traffic. Any other pull loops over its tries (tries), each checked at
// the image's registry beside the runtime's pull (try), under a durable
// intent written before the runtime is first asked (noteIntent), until
// one succeeds; once the registry accepted a try's credential, that
// credential is recorded before the answer (settle). Every allowed pull
// grants the pod the image.
func (g *Guard) Pull(ctx context.Context, req *runtimeapi.PullImageRequest, forward Forward) (string, error) {
	image, pod := req.GetImage().GetImage(), crireq.PodOf(req.GetSandboxConfig())
	tries := g.tries(req)
	repo, ok := g.repository(image)
	if !ok {
		// No name to decide on: the runtime says what it is.
		var pulled string
		for try := range tries.All(ctx) {
			ref, err := forward(ctx, try)
			tries.Answer(err)
			if err == nil {
				pulled = ref
			}
		}
		_, err := tries.Result()
		return pulled, err
	}
	cred := Credential{Hash: g.store.HashAuth(authOf(req.GetAuth()))}
	before, ok := g.answerFromNode(ctx, image, pod, repo, cred.Hash)
	if ok {
		return before, nil
	}
	// Before the runtime is asked what the name stands for: a removal of
	// that image from then on (RemoveImage forgets its record) leaves no
	// name of it to pass for preloaded.
	began := g.clock.Now()
	if before == "" {
		// What the name stands for before the pull, so that a pull that
		// fails can be told from one that left a new image. Unknown ("") if
		// the runtime does not say: any image found after a failure then
		// counts as arrived.
		if img, present, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: image}); err == nil && present {
			before = img.ID
		}
	}

	if err := g.RecordsAvailable(); err != nil {
		// The database could not be opened: no pull can be recorded,
		// answered from the node or not. Refused before the registry or the
		// runtime is asked, as the intent's write would refuse it. (A
		// database that fails a write is tried again by each pull.)
		g.metrics.recordErr.Inc()
		return "", errCannotRecord(image)
	}
	g.pending.inc(repo)
	defer g.pending.dec(repo)
	// The pull's layers count as private to other pulls until its record
	// is written (or it failed).
	run := &pullRun{image: image, repo: repo, pod: pod, before: before, began: began, flight: g.layers.Flights.Start()}
	defer g.layers.Flights.End(run.flight)
	var pulled string
	for try := range tries.All(ctx) {
		ref, err := g.try(ctx, run, try, forward)
		tries.Answer(err)
		if err == nil {
			pulled = ref // the sequence ends at the first success
		}
	}
	used, err := tries.Result()
	switch {
	case err != nil:
	case run.verified != nil:
		err = g.checkVerified(ctx, image, pulled, run.verified)
	case g.registry != nil:
		// The tries say one succeeded, and the registry verified none: a
		// record rests on the registry's word alone.
		err = fmt.Errorf("pulling %s: %w: %w", image, errNotVerified, errdefs.ErrUnavailable)
	}
	if err != nil {
		end := endOf(ctx, run, err)
		g.metrics.pulls.WithLabelValues("failure").Inc()
		g.settle(ctx, run, end, "", Credential{})
		return "", err
	}
	g.metrics.pulls.WithLabelValues("success").Inc()
	g.hidden.take(image)
	cred = g.recordedCredential(ctx, pod, repo, cred.Hash, used)
	ref, recorded := g.settle(ctx, run, endVerified, pulled, cred)
	if run.verified != nil {
		g.verifications.note(ref, repo, *run.verified, g.clock.Now())
	}
	g.grants.grant(pod.UID, ref, g.clock.Now())
	if recorded {
		g.logDecision(ctx, "PullImage: pulled from the registry, credential recorded", image, ref, pod.String(), describe(cred))
	} else {
		g.logDecision(ctx, "PullImage: pulled from the registry; the credential could not be recorded, every other pod verifies", image, ref, pod.String(), describe(cred))
	}
	return pulled, nil
}

// tries is the tries a pull of req goes with: credential injection's, or
// the request's own alone.
func (g *Guard) tries(req *runtimeapi.PullImageRequest) pullcred.Tries {
	if g.credentials == nil {
		return pullcred.Own(req)
	}
	return g.credentials.Tries(req)
}

// try is one try of a pull: the registry's word on its credential (Verify)
// beside the runtime's pull of it (forward). It returns the image
// reference to answer with; a try the registry verified notes that word
// in run.
func (g *Guard) try(ctx context.Context, run *pullRun, req *runtimeapi.PullImageRequest, forward Forward) (string, error) {
	if g.registry == nil {
		// Tests of the rest only: the daemon always has a registry check.
		if err := g.noteIntent(run); err != nil {
			return "", err
		}
		ref, err := forward(ctx, req)
		if err == nil {
			crireq.LearnPullRef(g.runtime, ref)
		}
		if cutShort(ctx, err) {
			run.stopped = true
		}
		return ref, err
	}
	ref, v, err := g.Verify(ctx, run, req, forward)
	if err == nil {
		run.verified = &v
	}
	return ref, err
}

// recordedCredential is the credential a pull's record holds: the one that
// succeeded. A plugin's, when the tries say so (the request had none, or
// the registry refused the request's own), else the request's (of hash
// hash; "" for none).
func (g *Guard) recordedCredential(ctx context.Context, pod crireq.Pod, repo, hash string, used pullcred.Used) Credential {
	switch {
	case used.Provider != "" && used.ServiceAccount != nil:
		// A token plugin pulled it with the pod's service account.
		sa := used.ServiceAccount
		return Credential{ServiceAccount: &ServiceAccount{Namespace: sa.Namespace, Name: sa.Name, UID: sa.UID}}
	case used.Provider != "":
		// Node-wide plugin credentials: every pod of the node could pull
		// it the same way.
		return Credential{Node: true}
	case hash == "":
		return Credential{Node: true} // anonymous
	}
	return Credential{Hash: hash, Secret: g.entitlements.secretOf(ctx, pod, repo, hash)}
}

// noteIntent durably notes the pull's intent, once, before the runtime is
// first asked: as the kubelet, no intent, no pull (a crash in between
// could not be told apart from a preloaded image). A pull the registry's
// word answers from the node writes none: the node does not change.
func (g *Guard) noteIntent(run *pullRun) error {
	if run.intent != "" {
		return nil
	}
	intent, err := g.store.AddIntent(run.image)
	if err != nil {
		g.metrics.recordErr.Inc()
		g.log.Error("noting a pull intent failed; the pull is refused until the database takes writes again", "image", run.image, "err", err)
		// The cause (a path, a disk) is the operator's: the pod's owner
		// reads this in an event.
		return errCannotRecord(run.image)
	}
	run.intent = intent
	return nil
}

// errCannotRecord refuses a pull whose intent or record cannot be written.
func errCannotRecord(image string) error {
	return fmt.Errorf("ensure: the pull of %s cannot be recorded now: %w; retry later", image, errdefs.ErrUnavailable)
}

// answerFromNode answers a pull that follows a hide when the request's
// credential, or the pod, is already verified for the hidden image: the
// image's ID, granted to the pod. When it does not answer, it returns the
// hidden image's ID ("" with no hide): what the name stood for before.
func (g *Guard) answerFromNode(ctx context.Context, image string, pod crireq.Pod, repo, hash string) (string, bool) {
	ref, hidden := g.hidden.peek(image, g.clock.Now())
	if !hidden {
		return "", false
	}
	ok, why := g.verified(ref, repo, hash)
	if !ok {
		// As the kubelet's MustAttemptImagePull: the pod may be entitled
		// by another of its pull secrets (rotated included), or by its
		// service account (a token plugin behind the proxy).
		if entitled, because := g.entitlements.podEntitled(ctx, pod, ref, repo); entitled {
			ok, why = true, because
		}
	}
	if !ok {
		g.logDecision(ctx, "PullImage: not answered from the node, the registry verifies", image, ref, pod.String(), why)
		return ref, false
	}
	g.hidden.take(image)
	g.grants.grant(pod.UID, ref, g.clock.Now())
	g.metrics.reuses.Inc()
	g.logDecision(ctx, "PullImage: answered from the node, no registry traffic", image, ref, pod.String(), why)
	return ref, true
}

// imageID returns the image ID a pull's image_ref stands for: the
// ref itself when it is an ID (containerd), else what the runtime answers
// for the name (a runtime that answers a repo digest). When it cannot be
// told, the ref is kept: a record under it can only be missed, never
// match another image.
func (g *Guard) imageID(ctx context.Context, name, ref string) string {
	return crireq.ImageID(ctx, g.runtime, name, ref)
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
func (g *Guard) namesBeforePull(ctx context.Context, run *pullRun, ref string) []string {
	image, repo, before, fl := run.image, run.repo, run.before, run.flight
	if g.removals.since(ref, run.began) || !g.layers.Observation.Await(ctx) {
		return nil
	}
	if _, err := g.store.Get(ref); !errors.Is(err, ErrNotFound) || g.unrecorded.has(ref) {
		return nil // a record (readable or not), or a pull of it that could not record
	}
	img, ok, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: ref})
	if err != nil || !ok || img.ID != ref {
		return nil
	}
	asked := g.parse(image).Lookup()
	var out []string
	for _, name := range img.Names {
		n := g.parse(name)
		own := 0
		if n.Repository == repo {
			own = 1 // this pull's own count
		}
		switch key := n.Lookup(); {
		case !n.OK:
		case key == asked && before != ref:
		case n.Repository == repo && strings.Contains(key, "@"):
		case g.pending.count(n.Repository) > own:
		default:
			out = append(out, key)
		}
	}
	if len(out) > 0 {
		if came, _ := g.layers.CameWithPrivateLayers(ctx, ref, fl); came {
			return nil
		}
	}
	return out
}

// checkVerified holds a pull that succeeded to the registry's word: the
// image the registry answered for the try's credential must be the one the
// runtime answered; else nothing is recorded for the credential, and the
// image is tracked as pulled with no verified credential.
func (g *Guard) checkVerified(ctx context.Context, image, pulled string, v *RegistryVerification) error {
	if v.ImageID == g.imageID(context.WithoutCancel(ctx), image, pulled) {
		return nil
	}
	g.log.WarnContext(ctx, "ensure: the registry verified another image than the pull answered; its credential is not recorded", "image", image, "verified", v.ImageID, "pulled", pulled)
	return fmt.Errorf("pulling %s: %w: %w", image, errNotVerified, errdefs.ErrUnavailable)
}

// errNotVerified is a pull whose image is not the one the registry
// verified for its credential.
var errNotVerified = errors.New("the pull could not be verified at the registry")
