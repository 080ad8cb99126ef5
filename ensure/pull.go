package ensure

import (
	"context"
	"errors"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"

	"github.com/containerd/errdefs"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/layerprivacy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// puller is the pull path of the guard: each pull's tries, checked at the
// registry beside the runtime's pull (verify.go), its end kept by the
// ledger (settle.go). It owns the registry check, credential injection,
// the runtime's store and the registry's last words (verifications); it
// shares with the rest of the guard the records (the Decider), the hides
// it answers after, the grants it gives, the layers in flight and the
// pods' entitlements.
type puller struct {
	*Decider
	ledger       *ledger
	layers       *layerprivacy.Node
	hidden       *hideTable
	grants       *grantTable
	entitlements *entitlements
	metrics      *metrics
	clock        clock.PassiveClock
	imagePolicy  ImagePolicy

	registry    RegistryCheck
	credentials Credentials
	manifests   RuntimeManifests
	// verifications are the registry's last words, for records explain.
	verifications *verificationTable
}

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
func (p *puller) Pull(ctx context.Context, req *runtimeapi.PullImageRequest, forward Forward) (string, error) {
	image, pod := req.GetImage().GetImage(), crireq.PodOf(req.GetSandboxConfig())
	tries := p.tries(req)
	repo, ok := p.repository(image)
	if !ok {
		return forwardEach(ctx, tries, forward) // no name to decide on: the runtime says what it is
	}
	cred := Credential{Hash: p.store.HashAuth(authOf(req.GetAuth()))}
	before, ok := p.answerFromNode(ctx, image, pod, repo, cred.Hash)
	if ok {
		return before, nil
	}
	// Before the runtime is asked what the name stands for: a removal of
	// that image from then on (RemoveImage forgets its record) leaves no
	// name of it to pass for preloaded.
	began := p.clock.Now()
	if before == "" {
		// What the name stands for before the pull, so that a pull that
		// fails can be told from one that left a new image. Unknown ("") if
		// the runtime does not say: any image found after a failure then
		// counts as arrived.
		if img, present, err := p.runtime.Image(ctx, crireq.ImageQuery{Name: image}); err == nil && present {
			before = img.ID
		}
	}

	if err := p.RecordsAvailable(); err != nil {
		// The database could not be opened: no pull can be recorded,
		// answered from the node or not. Refused before the registry or the
		// runtime is asked, as the intent's write would refuse it. (A
		// database that fails a write is tried again by each pull.)
		p.metrics.recordErr.Inc()
		return "", errCannotRecord(image)
	}
	p.pending.inc(repo)
	defer p.pending.dec(repo)
	// The pull's layers count as private to other pulls until its record
	// is written (or it failed).
	run := &pullRun{image: image, repo: repo, pod: pod, before: before, began: began, flight: p.layers.Flights.Start()}
	defer p.layers.Flights.End(run.flight)
	var pulled string
	for try := range tries.All(ctx) {
		ref, err := p.try(ctx, run, try, forward)
		tries.Answer(err)
		if err == nil {
			pulled = ref // the sequence ends at the first success
		}
	}
	used, err := tries.Result()
	switch {
	case err != nil:
	case run.verified != nil:
		err = p.checkVerified(ctx, image, pulled, run.verified)
	case p.registry != nil:
		// The tries say one succeeded, and the registry verified none: a
		// record rests on the registry's word alone.
		err = fmt.Errorf("pulling %s: %w: %w", image, errNotVerified, errdefs.ErrUnavailable)
	}
	if err != nil {
		end := endOf(ctx, run, err)
		p.metrics.pulls.WithLabelValues("failure").Inc()
		p.ledger.settle(ctx, run, end, "", Credential{})
		return "", err
	}
	p.succeeded(ctx, run, pulled, cred.Hash, used)
	return pulled, nil
}

// succeeded ends a pull whose try the registry verified, the runtime
// holding pulled: the credential that succeeded (used, else the request's
// own, of hash hash) recorded (settle), the pod granted the image.
func (p *puller) succeeded(ctx context.Context, run *pullRun, pulled, hash string, used pullcred.Used) {
	p.metrics.pulls.WithLabelValues("success").Inc()
	p.hidden.take(run.image)
	cred := p.recordedCredential(ctx, run.pod, run.repo, hash, used)
	ref, recorded := p.ledger.settle(ctx, run, endVerified, pulled, cred)
	if run.verified != nil {
		p.verifications.note(ref, run.repo, *run.verified, p.clock.Now())
	}
	p.grants.grant(run.pod.UID, ref, p.clock.Now())
	if recorded {
		p.logDecision(ctx, "PullImage: pulled from the registry, credential recorded", run.image, ref, run.pod.String(), describe(cred))
	} else {
		p.logDecision(ctx, "PullImage: pulled from the registry; the credential could not be recorded, every other pod verifies", run.image, ref, run.pod.String(), describe(cred))
	}
}

// forwardEach forwards each try as it is, until one succeeds: a pull of a
// name with no repository to decide on.
func forwardEach(ctx context.Context, tries pullcred.Tries, forward Forward) (string, error) {
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

// tries is the tries a pull of req goes with: credential injection's, or
// the request's own alone.
func (p *puller) tries(req *runtimeapi.PullImageRequest) pullcred.Tries {
	if p.credentials == nil {
		return pullcred.Own(req)
	}
	return p.credentials.Tries(req)
}

// try is one try of a pull: the registry's word on its credential (Verify)
// beside the runtime's pull of it (forward). It returns the image
// reference to answer with; a try the registry verified notes that word
// in run.
func (p *puller) try(ctx context.Context, run *pullRun, req *runtimeapi.PullImageRequest, forward Forward) (string, error) {
	if p.registry == nil {
		// Tests of the rest only: the daemon always has a registry check.
		if err := p.noteIntent(run); err != nil {
			return "", err
		}
		ref, err := forward(ctx, req)
		if err == nil {
			crireq.LearnPullRef(p.runtime, ref)
		}
		if cutShort(ctx, err) {
			run.stopped = true
		}
		return ref, err
	}
	ref, v, err := p.Verify(ctx, run, req, forward)
	if err == nil {
		run.verified = &v
	}
	return ref, err
}

// recordedCredential is the credential a pull's record holds: the one that
// succeeded. A plugin's, when the tries say so (the request had none, or
// the registry refused the request's own), else the request's (of hash
// hash; "" for none).
func (p *puller) recordedCredential(ctx context.Context, pod crireq.Pod, repo, hash string, used pullcred.Used) Credential {
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
	return Credential{Hash: hash, Secret: p.entitlements.secretOf(ctx, pod, repo, hash)}
}

// noteIntent durably notes the pull's intent, once, before the runtime is
// first asked: as the kubelet, no intent, no pull (a crash in between
// could not be told apart from a preloaded image). A pull the registry's
// word answers from the node writes none: the node does not change.
func (p *puller) noteIntent(run *pullRun) error {
	if run.intent != "" {
		return nil
	}
	intent, err := p.store.AddIntent(run.image)
	if err != nil {
		p.metrics.recordErr.Inc()
		p.log.Error("noting a pull intent failed; the pull is refused until the database takes writes again", "image", run.image, "err", err)
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
func (p *puller) answerFromNode(ctx context.Context, image string, pod crireq.Pod, repo, hash string) (string, bool) {
	ref, hidden := p.hidden.peek(image, p.clock.Now())
	if !hidden {
		return "", false
	}
	ok, why := p.verified(ref, repo, hash)
	if !ok {
		// As the kubelet's MustAttemptImagePull: the pod may be entitled
		// by another of its pull secrets (rotated included), or by its
		// service account (a token plugin behind the proxy).
		if entitled, because := p.entitlements.podEntitled(ctx, pod, ref, repo); entitled {
			ok, why = true, because
		}
	}
	if !ok {
		p.logDecision(ctx, "PullImage: not answered from the node, the registry verifies", image, ref, pod.String(), why)
		return ref, false
	}
	p.hidden.take(image)
	p.grants.grant(pod.UID, ref, p.clock.Now())
	p.metrics.reuses.Inc()
	p.logDecision(ctx, "PullImage: answered from the node, no registry traffic", image, ref, pod.String(), why)
	return ref, true
}

// checkVerified holds a pull that succeeded to the registry's word: the
// image the registry answered for the try's credential must be the one the
// runtime answered; else nothing is recorded for the credential, and the
// image is tracked as pulled with no verified credential.
func (p *puller) checkVerified(ctx context.Context, image, pulled string, v *RegistryVerification) error {
	if v.ImageID == p.imageID(context.WithoutCancel(ctx), image, pulled) {
		return nil
	}
	p.log.WarnContext(ctx, "ensure: the registry verified another image than the pull answered; its credential is not recorded", "image", image, "verified", v.ImageID, "pulled", pulled)
	return fmt.Errorf("pulling %s: %w: %w", image, errNotVerified, errdefs.ErrUnavailable)
}

// errNotVerified is a pull whose image is not the one the registry
// verified for its credential.
var errNotVerified = errors.New("the pull could not be verified at the registry")
