package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/layerprivacy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// RuntimeManifests reads a manifest's bytes from the runtime's own store
// once its pull fetched them, waiting until then or until ctx ends;
// *runtimecontent.Reader (containerd's content API) is the real one.
type RuntimeManifests interface {
	Manifest(ctx context.Context, d digest.Digest) ([]byte, error)
}

// RegistryCheck asks an image's own registry (never a mirror the operator
// did not vouch for) whether a credential can read the image in its
// repository, content-aware; *registry.Checker is the real one.
type RegistryCheck interface {
	Check(ctx context.Context, r registry.Request) (registry.Result, error)
}

// Verify is the registry's word on one try of a pull: the credential it
// goes with, as the innermost hook sees it (the request's own, or the one
// credential injection put in), is checked at the image's registry. A pull
// that succeeded is no proof: a mirror in the runtime's hosts.toml may
// have answered it, or the runtime fetched nothing because the content was
// already on the node under another name.
//
//   - When the name stood for an image already on the node (the outer Pull
//     said so) and the registry names, for this credential, the manifest
//     the runtime recorded for it, the config serves its bytes, and every
//     layer the node would share is vouched for (layersToProve), the pull
//     is answered from the node: no runtime pull.
//
//   - Otherwise the runtime pulls, and the registry is asked beside it
//     (the registry's word by HEAD, then, once the runtime pulled, the
//     config by its bytes and the layers): the pod is answered when both
//     are done. The runtime's manifest must be the one the registry names
//     (else the tag moved, or the runtime got it elsewhere: Aborted). No
//     manifest GET beyond the runtime's own, which a registry may count as
//     a pull; a layer to prove needs one.
//
//   - A registry that refuses, or cannot be asked, refuses the try (the
//     credential injection outside may try the next credential), and stops
//     the runtime's pull if it still runs: no record for the credential;
//     what the runtime left is tracked by the outer Pull.
//
//   - With an image policy that applies to the image, each try is decided
//     on the manifest digest the registry names before the runtime is
//     asked: a refused image leaves the node as it was (no new image, no
//     tag moved to it). The runtime's image must then be that manifest's,
//     so the pull is pinned to it; the verdict is bound to the image ID
//     the pull produced.
//
// try is the try's request, its credential in Auth; forward is the
// runtime's pull of it. Verify returns the image ID to answer with. A try
// whose runtime pull it stopped before the runtime answered marks run
// stopped: the runtime may still create the image.
func (p *puller) Verify(ctx context.Context, run *pullRun, try *runtimeapi.PullImageRequest, forward Forward) (string, RegistryVerification, error) {
	image, pod, repo, present := run.image, run.pod, run.repo, run.before
	cred := registry.CredentialOf(try.GetAuth())
	policy := &policyDecision{policy: p.imagePolicy, image: image, pod: pod, cred: cred}
	req := registry.Request{Image: image, Credential: cred, Blobs: true,
		ProveLayers: p.layerChooser(image, repo, run.flight, cred.Kind() == registry.KindAnonymous),
	}
	// The runtime is asked only once the image policy allowed the digest
	// the registry names, when a policy applies to the image (onDigest).
	var onDigest *policyDecision
	switch {
	case p.imagePolicy.NameDecides(pod, image):
		// No provider applies: the namespace's no-match policy decides on
		// the name, before the runtime is asked (a Deny namespace pulls
		// nothing it refuses).
		if err := policy.decide(ctx, "", ""); err != nil {
			return "", RegistryVerification{}, err
		}
	case p.hasImagePolicy():
		onDigest = policy
	}
	if present != "" {
		// Asked again, not taken from the pull's first look: the image may
		// have been removed since, and its ID would answer for nothing.
		held, err := p.pulledImage(ctx, image, repo, present)
		if err != nil {
			return "", RegistryVerification{}, err
		}
		req := req
		req.Beside = heldImage{held: held, id: present, onDigest: onDigest}
		res, err := p.registry.Check(ctx, req)
		switch {
		case err == nil:
			policy.bind(present)
			return present, p.registryWord(ctx, image, res, present, true), nil
		case errors.Is(err, registry.ErrMoved):
			// The tag moved since the image came to the node: the runtime
			// pulls the new one, which must be what the registry names now
			// (and what the image policy allows, before the runtime pulls).
		case errors.As(err, new(policyRefusal)):
			return "", RegistryVerification{}, err
		default:
			return "", RegistryVerification{}, p.checkFailed(ctx, image, err)
		}
	}
	pulled, res, err := p.pullBeside(ctx, run, req, onDigest, try, forward)
	if err != nil {
		return "", RegistryVerification{}, err
	}
	policy.bind(res.ConfigDigest.String())
	return pulled, p.registryWord(ctx, image, res, res.ConfigDigest.String(), false), nil
}

// hasImagePolicy reports whether an image policy is configured.
func (p *puller) hasImagePolicy() bool {
	_, none := p.imagePolicy.(noImagePolicy)
	return !none
}

// policyDecision is image policy's decision on one try of a pull: on the
// name alone, or on the manifest digest the registry names. Allowed, its
// verdict is bound to the image the try produced.
type policyDecision struct {
	policy ImagePolicy
	image  string
	pod    crireq.Pod
	cred   registry.Credential
	// allowed binds the verdict; nil until the policy allowed the try.
	allowed func(imageID string)
}

// decide decides the try on manifest ("" for the name alone); imageID is
// the image on the node the name stands for, if that manifest is its. A
// refusal ends the registry check as the policy words it (policyRefusal).
func (pd *policyDecision) decide(ctx context.Context, manifest digest.Digest, imageID string) error {
	bind, err := pd.policy.Pull(ctx, pd.image, pd.pod, pd.cred, manifest, imageID)
	if err != nil {
		return policyRefusal{err}
	}
	pd.allowed = bind
	return nil
}

// bind carries the verdict over to the image the try produced; with no
// decision (no image policy applies), there is none to bind.
func (pd *policyDecision) bind(imageID string) {
	if pd.allowed != nil {
		pd.allowed(imageID)
	}
}

// errRuntimePull stands, inside the registry check, for the runtime's pull
// that failed: Verify answers with the runtime's own error.
var errRuntimePull = errors.New("the runtime's pull failed")

// errNoRuntimeStore is a manifest the check cannot read from the
// runtime's store: it asks the registry for the config after the pull.
var errNoRuntimeStore = errors.New("the runtime's store is not read")

// policyRefusal is the image policy's refusal, ending a registry check: it
// reaches the pod as the policy words it.
type policyRefusal struct{ error }

func (p policyRefusal) Unwrap() error { return p.error }

// heldImage is the image already on the node that the pull's name stands
// for, as the registry check meets it (registry.RuntimePull): pulled
// before (held), so the registry's digest must be one of its manifests
// (else the tag moved: ErrMoved), and image policy decides on that digest
// (onDigest; nil when decided already).
type heldImage struct {
	held     registry.PulledImage
	id       string
	onDigest *policyDecision
}

func (h heldImage) Resolved(ctx context.Context, manifest digest.Digest) error {
	if !slices.Contains(h.held.ManifestDigests, manifest) {
		return fmt.Errorf("the registry names manifest %s, not the image on the node: %w", manifest, registry.ErrMoved)
	}
	if h.onDigest == nil {
		return nil
	}
	return h.onDigest.decide(ctx, manifest, h.id)
}

func (heldImage) Manifest(context.Context, digest.Digest) ([]byte, error) {
	return nil, errNoRuntimeStore // nothing is being pulled: the config is asked at once
}

func (h heldImage) Pulled(context.Context) (registry.PulledImage, error) { return h.held, nil }

// runtimePull is the runtime's pull of one try, run beside the registry
// check (registry.RuntimePull): it starts once image policy allowed the
// manifest the registry names (onDigest; at once without it), and the
// check waits for it (Pulled).
type runtimePull struct {
	pulls    *puller
	run      *pullRun
	onDigest *policyDecision
	// allowed is closed once the runtime may be asked; done carries its
	// answer. out is that answer once the check waited for it (waited).
	allowed chan struct{}
	done    chan pullOutcome
	out     pullOutcome
	waited  bool
}

// pullOutcome is the runtime's answer to a try; started is false for a try
// never asked.
type pullOutcome struct {
	ref     string
	err     error
	started bool
}

func (rp *runtimePull) Resolved(ctx context.Context, manifest digest.Digest) error {
	if rp.onDigest == nil {
		return nil // allowed from the start
	}
	if err := rp.onDigest.decide(ctx, manifest, ""); err != nil {
		return err
	}
	close(rp.allowed)
	return nil
}

func (rp *runtimePull) Manifest(ctx context.Context, d digest.Digest) ([]byte, error) {
	if rp.pulls.manifests == nil {
		return nil, errNoRuntimeStore
	}
	return rp.pulls.manifests.Manifest(ctx, d)
}

func (rp *runtimePull) Pulled(ctx context.Context) (registry.PulledImage, error) {
	select {
	case rp.out = <-rp.done:
		rp.waited = true
	case <-ctx.Done():
		return registry.PulledImage{}, ctx.Err()
	}
	if rp.out.err != nil {
		return registry.PulledImage{}, errRuntimePull
	}
	return rp.pulls.pulledImage(context.WithoutCancel(ctx), rp.run.image, rp.run.repo, rp.out.ref)
}

// pullBeside runs the runtime's pull of try (forward) and the registry
// check of req beside it, and returns the runtime's image reference and
// the check's result once both are done. With onDigest (the image policy's
// verdict on the manifest the registry names), the runtime's pull starts
// only once it allowed it: a refusal before then leaves the node as it
// was. A check that ends first with a refusal stops the pull (and waits
// for it to end), marking run stopped when the runtime had not answered;
// a pull that fails is answered with the runtime's own error.
func (p *puller) pullBeside(ctx context.Context, run *pullRun, req registry.Request, onDigest *policyDecision, try *runtimeapi.PullImageRequest, forward Forward) (string, registry.Result, error) {
	image := run.image
	if err := p.noteIntent(run); err != nil {
		return "", registry.Result{}, err
	}
	pullCtx, stop := context.WithCancel(ctx)
	defer stop()
	rp := &runtimePull{pulls: p, run: run, onDigest: onDigest, allowed: make(chan struct{}), done: make(chan pullOutcome, 1)}
	if onDigest == nil {
		close(rp.allowed)
	}
	go func() {
		select {
		case <-rp.allowed:
		case <-pullCtx.Done():
		}
		if err := pullCtx.Err(); err != nil {
			rp.done <- pullOutcome{err: err} // never asked: nothing to settle of this try
			return
		}
		ref, err := forward(pullCtx, try)
		if err == nil {
			crireq.LearnPullRef(p.runtime, ref)
		}
		rp.done <- pullOutcome{ref, err, true}
	}()
	req.Beside = rp
	res, err := p.registry.Check(ctx, req)
	out := rp.out
	if !rp.waited {
		// The check ended first (a refusal, the registry unreachable, the
		// image policy): the runtime's pull is not wanted; it ends.
		select {
		case out = <-rp.done: // it had answered already: its word is known
		default:
			stop()
			out = <-rp.done
		}
	}
	if out.started && cutShort(pullCtx, out.err) {
		// Stopped (by the proxy or its caller) before it answered:
		// containerd goes on after its client's cancel and may create the
		// image a moment later.
		run.stopped = true
	}
	switch {
	case rp.waited && out.err != nil:
		return "", res, out.err // the runtime's own answer: injection may try the next credential
	case errors.As(err, new(policyRefusal)):
		return "", res, err // the image policy's, as it words it for the pod
	case err != nil:
		return "", res, p.checkFailed(ctx, image, err)
	case !rp.waited:
		return "", res, fmt.Errorf("pulling %s: the registry check ended without the runtime's pull: %w", image, errdefs.ErrInternal)
	}
	id := p.imageID(context.WithoutCancel(ctx), image, out.ref)
	if err := crireq.PulledAsAnswered(image, id, res.ConfigDigest); err != nil {
		p.log.WarnContext(ctx, "ensure: the runtime pulled another image than the registry answered; its credential is not recorded",
			"image", image, "pulled", id, "registry", res.Endpoint, "answered", res.ConfigDigest, "cause", "a tag moved, or the runtime got the image elsewhere")
		return "", res, err
	}
	return out.ref, res, nil
}

// cutShort reports whether a runtime's pull under ctx ended with err
// because ctx ended (the runtime's answer is then only its client's
// cancel, not its word on the pull): a cancellation, with ctx done.
func cutShort(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// pulledImage is what the runtime proved of the image ref it holds for
// image (repository repo): its ID, and the manifest digests it recorded
// for repo (containerd fetched and verified those bytes).
func (p *puller) pulledImage(ctx context.Context, image, repo, ref string) (registry.PulledImage, error) {
	id := p.imageID(ctx, image, ref)
	held := registry.PulledImage{ImageID: crireq.IDDigest(id)}
	img, ok, err := p.runtime.Image(ctx, crireq.ImageQuery{Name: id})
	if err != nil || !ok {
		// Not a word on the manifest: the registry's is taken whole.
		return held, nil
	}
	for _, name := range img.Names {
		if n := p.parse(name); n.OK && n.Repository == repo && n.Digest() != "" {
			if d, err := digest.Parse(n.Digest()); err == nil {
				held.ManifestDigests = append(held.ManifestDigests, d)
			}
		}
	}
	return held, nil
}

// registryWord is the registry's word a check gave, as Pull records it,
// said in the decision log.
func (p *puller) registryWord(ctx context.Context, image string, res registry.Result, id string, fromNode bool) RegistryVerification {
	var checked []string
	if res.BlobsChecked > 0 {
		for _, b := range res.Blobs[:min(len(res.Blobs), MaxListedBlobs)] {
			checked = append(checked, b.String())
		}
	}
	v := RegistryVerification{
		ImageID: id, Registry: res.Registry, Endpoint: res.Endpoint, Vouched: res.Vouched, CredentialKind: res.CredentialKind,
		ManifestDigest: res.ManifestDigest.String(), Blobs: res.BlobsChecked, CheckedBlobs: checked, Requests: res.Requests, FromNode: fromNode,
		Layers: diffIDsOf(res.Layers), LayersKnown: res.Layers != nil, ProvenLayers: res.Proven, ProvenBytes: res.ProvenBytes,
	}
	what := "PullImage: the registry verified the credential; the runtime pulled"
	if fromNode {
		what = "PullImage: the registry verified the credential; answered from the node"
	}
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.DebugContext(ctx, "ensure decision", "decision", what, "image", image, "imageRef", id,
			"endpoint", res.Endpoint, "vouched", res.Vouched, "credential", res.CredentialKind,
			"manifest", res.ManifestDigest.String(), "blobsChecked", res.BlobsChecked, "blobs", checked, "requests", res.Requests,
			"layersProven", res.Proven, "bytesProven", res.ProvenBytes)
	}
	return v
}

// checkFailed is a refused try: the operator's log names the registry and
// the cause; the pod's owner reads registry.Refusal.
func (p *puller) checkFailed(ctx context.Context, image string, err error) error {
	switch {
	case errors.Is(err, registry.ErrForged):
		p.log.WarnContext(ctx, "ensure: the registry served bytes that are not the image's content; the pull is refused", "image", image, "err", err)
	case errors.Is(err, registry.ErrDenied):
		p.log.InfoContext(ctx, "ensure: the registry refused the pull's credential", "image", image, "err", err)
	case errors.Is(err, registry.ErrMoved):
		p.log.InfoContext(ctx, "ensure: the registry's answer is not the image", "image", image, "err", err)
	case errors.Is(err, registry.ErrUnreachable):
		p.log.WarnContext(ctx, "ensure: the registry cannot be asked; the pull is refused until it can", "image", image, "err", err)
	}
	return registry.Refusal(image, err)
}

// layerChooser is the registry check's question for one try of a pull of
// image (repository repo): which layers of the image it resolved must be
// proven by their bytes. The check asks it once the runtime pulled (or
// for the image already on the node), so it sees what the node held when
// the runtime built the image: it enters the pull's layers in flight, and
// waits for the other pulls in flight to know theirs (bounded by
// layerprivacy.FlightWait: past it, their layers count as private).
func (p *puller) layerChooser(image, repo string, fl *layerprivacy.Flight, anonymous bool) registry.LayerChooser {
	return func(ctx context.Context, imageID digest.Digest, layers []registry.Layer) ([]digest.Digest, error) {
		diffIDs := diffIDsOf(layers)
		if fl != nil {
			p.layers.Flights.Set(fl, imageID.String(), diffIDs, anonymous)
		}
		wctx, cancel := context.WithTimeout(ctx, layerprivacy.FlightWait)
		known := p.layers.Flights.WaitKnown(wctx, fl)
		cancel()
		p.layers.Observation.Await(ctx) // what was there before decides which layers are public
		if p.ledger.kept.any() {
			// A pull cut short (or a crash) may have left an image since:
			// the runtime says what it holds now, and what it left is
			// tracked with its layers before they are decided on.
			if images, err := p.runtime.Images(ctx); err != nil {
				known = false
			} else {
				p.ledger.settleKept(ctx, images)
			}
		}
		want, why := p.layers.ToProve(imageID.String(), repo, diffIDs, fl, !known)
		if len(want) > 0 {
			p.logDecision(ctx, "PullImage: layers the node shares from elsewhere must be proven by their bytes", image, imageID.String(), "", fmt.Sprint(why))
		}
		return want, nil
	}
}

func diffIDsOf(layers []registry.Layer) []digest.Digest {
	out := make([]digest.Digest, len(layers))
	for i, l := range layers {
		out[i] = l.DiffID
	}
	return out
}
