package ensure

import (
	"context"
	"errors"
	"fmt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// PullRequest is a pull as the guard decides it: the image as named, the
// pod it is for (empty for crictl and bake), and the request's own
// credential.
type PullRequest struct {
	Image string
	Pod   crireq.Pod
	Auth  Auth
}

// Forward is the runtime's pull of one try, with that try's credential;
// it returns the image reference the runtime answered.
type Forward func(ctx context.Context) (imageRef string, err error)

// Tries runs the tries of a pull: one per credential the pull may go with,
// in the order they are to be tried (the request's own, then credential
// injection's: the kubelet's keyring order), until one succeeds. each is
// one try: the credential it goes with, and the runtime's pull of it. It
// returns the image reference of the try that succeeded, and which
// credential that was.
type Tries func(ctx context.Context, each func(ctx context.Context, cred registry.Credential, forward Forward) (string, error)) (string, pullcred.Used, error)

// Credentials runs a pull's tries with the credentials the node has for
// the image (credential injection's plugins), after the request's own;
// *credplugins.Injector is the real one. Without it, a pull has the one
// try of the request's own credential.
type Credentials interface {
	Pull(ctx context.Context, req *runtimeapi.PullImageRequest, try func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error)) (*runtimeapi.PullImageResponse, pullcred.Used, error)
}

// Pull answers a pull. Right after a hide, a pull whose credential (or
// whose pod, by its secrets or service account) is already verified for
// the image is answered from the node: its image ID, no registry traffic.
// Any other pull runs its tries, each checked at the image's registry
// (Verify) beside the runtime's pull, under a durable intent written
// before the runtime is first asked (noteIntent), and, once the
// registry accepted a try's credential, that credential is recorded before
// the answer. Every allowed pull grants the pod the image.
func (g *Guard) Pull(ctx context.Context, req PullRequest, tries Tries) (string, error) {
	repo, ok := g.repository(req.Image)
	if !ok {
		// No name to decide on: the runtime says what it is.
		ref, _, err := tries(ctx, func(ctx context.Context, _ registry.Credential, forward Forward) (string, error) { return forward(ctx) })
		return ref, err
	}
	cred := Credential{Hash: g.store.HashAuth(req.Auth)}
	before, ok := g.answerFromNode(ctx, req, repo, cred.Hash)
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
		if img, present, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: req.Image}); err == nil && present {
			before = img.ID
		}
	}

	if err := g.RecordsAvailable(); err != nil {
		// The database could not be opened: no pull can be recorded,
		// answered from the node or not. Refused before the registry or the
		// runtime is asked, as the intent's write would refuse it. (A
		// database that fails a write is tried again by each pull.)
		g.metrics.recordErr.Inc()
		return "", errCannotRecord(req.Image)
	}
	g.pending.inc(repo)
	defer g.pending.dec(repo)
	// The pull's layers count as private to other pulls until its record
	// is written (or it failed).
	run := &pullRun{image: req.Image, repo: repo, pod: req.Pod, before: before, began: began, flight: g.flights.start()}
	defer g.flights.end(run.flight)
	pulled, used, err := tries(ctx, func(ctx context.Context, cred registry.Credential, forward Forward) (string, error) {
		if g.registry == nil {
			// Tests of the rest only: the daemon always has a registry check.
			if err := g.noteIntent(run); err != nil {
				return "", err
			}
			ref, err := forward(ctx)
			if err == nil {
				crireq.LearnPullRef(g.runtime, ref)
			}
			if cutShort(ctx, err) {
				run.stopped = true
			}
			return ref, err
		}
		ref, v, err := g.Verify(ctx, run, cred, forward)
		if err == nil {
			run.verified = &v
		}
		return ref, err
	})
	if err == nil && run.verified != nil {
		err = g.checkVerified(ctx, req.Image, pulled, run.verified)
	}
	if err != nil {
		end := endOf(ctx, run, err)
		g.metrics.pulls.WithLabelValues("failure").Inc()
		g.settle(ctx, run, end, "", Credential{})
		return "", err
	}
	g.metrics.pulls.WithLabelValues("success").Inc()
	g.hidden.take(req.Image)
	// The record holds the credential that succeeded: a plugin's, when the
	// tries say so (the request had none, or the registry refused the
	// request's own), else the request's.
	if used.Provider != "" {
		if sa := used.ServiceAccount; sa != nil {
			// A token plugin pulled it with the pod's service account.
			cred = Credential{ServiceAccount: &ServiceAccount{Namespace: sa.Namespace, Name: sa.Name, UID: sa.UID}}
		} else {
			// Node-wide plugin credentials: every pod of the node could pull
			// it the same way.
			cred = Credential{Node: true}
		}
	} else if cred.Hash == "" {
		cred.Node = true // anonymous
	}
	if cred.Hash != "" {
		cred.Secret = g.secretOf(ctx, req.Pod, repo, cred.Hash)
	}
	ref, recorded := g.settle(ctx, run, endVerified, pulled, cred)
	if run.verified != nil {
		g.verifications.note(ref, repo, *run.verified, g.clock.Now())
	}
	g.grants.grant(req.Pod.UID, ref, g.clock.Now())
	if recorded {
		g.logDecision(ctx, "PullImage: pulled from the registry, credential recorded", req.Image, ref, req.Pod.String(), describe(cred))
	} else {
		g.logDecision(ctx, "PullImage: pulled from the registry; the credential could not be recorded, every other pod verifies", req.Image, ref, req.Pod.String(), describe(cred))
	}
	return pulled, nil
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
func (g *Guard) answerFromNode(ctx context.Context, req PullRequest, repo, hash string) (string, bool) {
	ref, hidden := g.hidden.peek(req.Image, g.clock.Now())
	if !hidden {
		return "", false
	}
	ok, why := g.verified(ref, repo, hash)
	if !ok {
		// As the kubelet's MustAttemptImagePull: the pod may be entitled
		// by another of its pull secrets (rotated included), or by its
		// service account (a token plugin behind the proxy).
		if entitled, because := g.podEntitled(ctx, req.Pod, ref, repo); entitled {
			ok, why = true, because
		}
	}
	if !ok {
		g.logDecision(ctx, "PullImage: not answered from the node, the registry verifies", req.Image, ref, req.Pod.String(), why)
		return ref, false
	}
	g.hidden.take(req.Image)
	g.grants.grant(req.Pod.UID, ref, g.clock.Now())
	g.metrics.reuses.Inc()
	g.logDecision(ctx, "PullImage: answered from the node, no registry traffic", req.Image, ref, req.Pod.String(), why)
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
	if g.removals.since(ref, run.began) || !g.awaitObserved(ctx) {
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
		if came, _ := g.cameWithPrivateLayers(ctx, ref, fl); came {
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
