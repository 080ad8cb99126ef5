package ensure

import (
	"context"
	"errors"
	"fmt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"strings"
	"time"

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
// Any other pull runs its tries under a durable intent, each checked at
// the image's registry (Verify) beside the runtime's pull, and, once the
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
	if before == "" {
		// What the name stands for before the pull, so that a pull that
		// fails can be told from one that left a new image. Unknown ("") if
		// the runtime does not say: any image found after a failure then
		// counts as arrived.
		if img, present, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: req.Image}); err == nil && present {
			before = img.ID
		}
	}

	intent, err := g.store.AddIntent(req.Image)
	if err != nil {
		// As the kubelet: no intent, no pull (a crash could not be told apart
		// from a preloaded image).
		g.metrics.recordErr.Inc()
		g.log.Error("noting a pull intent failed; the pull is refused until the database takes writes again", "image", req.Image, "err", err)
		// The cause (a path, a disk) is the operator's: the pod's owner
		// reads this in an event.
		return "", fmt.Errorf("ensure: the pull of %s cannot be recorded now: %w; retry later", req.Image, errdefs.ErrUnavailable)
	}
	g.pending.inc(repo)
	defer g.pending.dec(repo)
	// The pull's layers count as private to other pulls until its record
	// is written (or it failed).
	fl := g.flights.start()
	defer g.flights.end(fl)
	// The registry's word on the try that succeeded (tries run one after
	// the other).
	var verified *RegistryVerification
	pulled, used, err := tries(ctx, func(ctx context.Context, cred registry.Credential, forward Forward) (string, error) {
		if g.registry == nil {
			return forward(ctx) // tests of the rest only: the daemon always has a registry check
		}
		ref, v, err := g.Verify(ctx, req.Image, req.Pod, cred, before, fl, forward)
		if err == nil {
			verified = &v
		}
		return ref, err
	})
	if err == nil && verified != nil {
		err = g.checkVerified(ctx, req.Image, pulled, verified)
	}
	if err != nil {
		g.metrics.pulls.WithLabelValues("failure").Inc()
		g.settleFailedPull(ctx, req.Image, repo, intent, before, fl)
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
	ref := g.imageID(ctx, req.Image, pulled)
	unlock := g.refs.lock(ref)
	defer unlock()
	preloaded := g.listedBefore(ctx, req.Image, repo, ref, before, fl)
	if v := verified; v != nil && v.LayersKnown {
		// The registry vouched for every layer as repo: kept with the record.
		err = g.store.RecordVerifiedPull(ref, repo, cred, v.Layers, intent, g.clock.Now(), preloaded)
	} else {
		err = g.store.RecordPull(ref, repo, cred, intent, g.clock.Now(), preloaded)
	}
	if err != nil {
		g.recordFailed(req.Image, repo, ref, intent, err)
	} else {
		g.settlePulled(req.Image)
	}
	if verified != nil {
		g.verifications.note(ref, repo, *verified, g.clock.Now())
	}
	g.grants.grant(req.Pod.UID, ref, g.clock.Now())
	g.logDecision(ctx, "PullImage: pulled from the registry, credential recorded", req.Image, ref, req.Pod.String(), describe(cred))
	return pulled, nil
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

// listedBefore returns the names the image ref, which a pull of image (of
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
// What is left out needs verification, as an image without preloaded
// names does: the error is on the safe side. See decide for what the names then allow.
func (g *Guard) listedBefore(ctx context.Context, image, repo, ref, before string, fl *layerFlight) []string {
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
	return fmt.Errorf("pulling %s: the pull could not be verified at the registry: %w", image, errdefs.ErrUnavailable)
}

// settleTimeout bounds the question a failed pull asks the runtime.
const settleTimeout = 10 * time.Second

// settleFailedPull tracks what a pull that failed, was cancelled or cut
// may have left: the runtime may have finished (or half-finished) it after
// the caller went away. It asks the runtime, with a context of the
// proxy's own (the caller's may be gone), what the name stands for now:
//   - a new image (not the one before the pull): recorded as pulled with
//     no verified credential, in the intent's transaction, so every pod
//     verifies, and never taken for a preloaded one;
//   - nothing new, and the runtime answered the pull: this pull's intent
//     goes. Intents kept from earlier pulls of the image (a crash, a cut
//     pull) stay: only a GC run, which lists the runtime's images, settles
//     those;
//   - nothing new yet, but the caller went away: the runtime's pull may
//     still be finishing (containerd goes on after its client's cancel
//     and may create the image a moment after this question), so this
//     answer is not the last word: the intent is kept, as below;
//   - no answer: the intent is kept, and its repository counts as a pull
//     in flight, until a GC run finds the image, a pull of it through the
//     proxy succeeds, or the next start settles it.
func (g *Guard) settleFailedPull(ctx context.Context, image, repo, intent, before string, fl *layerFlight) {
	cut := ctx.Err() != nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	img, present, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: image})
	switch {
	case err != nil:
		g.keepIntent(Intent{ID: intent, Image: image}, repo)
		g.log.Warn("a pull failed and the runtime cannot say what it left; its intent is kept until it can", "image", image, "err", err)
	case present && img.ID != before:
		unlock := g.refs.lock(img.ID)
		defer unlock()
		preloaded := g.listedBefore(ctx, image, repo, img.ID, before, fl)
		if err := g.store.RecordPull(img.ID, repo, Credential{}, intent, g.clock.Now(), preloaded); err != nil {
			g.recordFailed(image, repo, img.ID, intent, err)
			return
		}
		g.logDecision(ctx, "PullImage: failed, but the image arrived: tracked with no verified credential", image, img.ID, "", "every pod verifies")
	case cut:
		g.keepIntent(Intent{ID: intent, Image: image}, repo)
		g.log.Info("a pull was cut before the runtime said it finished; its intent is kept", "image", image, "settledBy", "a GC run or a pull of the image")
	default:
		if err := g.store.DropIntent(intent); err != nil {
			g.keepIntent(Intent{ID: intent, Image: image}, repo)
			g.log.Warn("dropping a pull intent failed; it is kept until a GC run settles it", "image", image, "err", err)
		}
	}
}

// recordFailed keeps a pull's intent whose record could not be written.
// Until a GC run (or the next start) settles it, as the kubelet's intent
// counter does, the image counts as pulled by the proxy with no verified
// credential, by its repository and by its ID: never as preloaded.
func (g *Guard) recordFailed(image, repo, ref, intent string, err error) {
	g.keepIntent(Intent{ID: intent, Image: image}, repo)
	g.unrecorded.inc(ref)
	g.metrics.recordErr.Inc()
	g.log.Error("recording a pull failed; every other pod verifies the image", "image", image, "imageRef", ref,
		"until", "its intent is settled", "err", err)
}
