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

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
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
// forward is the runtime's pull; it returns the image reference it
// answered. Verify returns the image ID to answer with. A try whose
// runtime pull it stopped before the runtime answered marks run stopped:
// the runtime may still create the image.
func (g *Guard) Verify(ctx context.Context, run *pullRun, cred registry.Credential, forward Forward) (string, RegistryVerification, error) {
	image, pod, repo, present := run.image, run.pod, run.repo, run.before
	var verdict imagepolicy.Verdict
	decide := func(ctx context.Context, manifest digest.Digest, imageID string) error {
		v, err := g.imagePolicy.Pull(ctx, image, pod, cred, manifest, imageID)
		verdict = v
		if err != nil {
			return policyRefusal{err}
		}
		return nil
	}
	req := registry.Request{Image: image, Credential: cred, Blobs: true,
		ProveLayers: g.layerChooser(image, repo, run.flight, cred.Kind() == registry.KindAnonymous),
	}
	// The runtime is asked only once the image policy allowed the digest
	// the registry names, when a policy applies to the image (Resolved).
	switch {
	case g.imagePolicy.NameDecides(pod, image):
		// No provider applies: the namespace's no-match policy decides on
		// the name, before the runtime is asked (a Deny namespace pulls
		// nothing it refuses).
		if err := decide(ctx, "", ""); err != nil {
			return "", RegistryVerification{}, err
		}
	case g.hasImagePolicy():
		req.Resolved = func(ctx context.Context, manifest digest.Digest) error { return decide(ctx, manifest, "") }
	}
	if present != "" {
		// Asked again, not taken from the pull's first look: the image may
		// have been removed since, and its ID would answer for nothing.
		held, err := g.pulledImage(ctx, image, repo, present)
		if err != nil {
			return "", RegistryVerification{}, err
		}
		req := req
		req.Pulled = func(context.Context) (registry.PulledImage, error) { return held, nil }
		decided := req.Resolved == nil
		req.Resolved = func(ctx context.Context, manifest digest.Digest) error {
			if !slices.Contains(held.ManifestDigests, manifest) {
				return fmt.Errorf("the registry names manifest %s, not the image on the node: %w", manifest, registry.ErrMoved)
			}
			if decided {
				return nil
			}
			return decide(ctx, manifest, present)
		}
		res, err := g.registry.Check(ctx, req)
		switch {
		case err == nil:
			g.imagePolicy.Bind(verdict, present)
			return present, g.registryWord(ctx, image, res, present, true), nil
		case errors.Is(err, registry.ErrMoved):
			// The tag moved since the image came to the node: the runtime
			// pulls the new one, which must be what the registry names now
			// (and what the image policy allows, before the runtime pulls).
		case errors.As(err, new(policyRefusal)):
			return "", RegistryVerification{}, err
		default:
			return "", RegistryVerification{}, g.checkFailed(ctx, image, err)
		}
	}
	pulled, res, err := g.pullBeside(ctx, run, req, forward)
	if err != nil {
		return "", RegistryVerification{}, err
	}
	g.imagePolicy.Bind(verdict, res.ConfigDigest.String())
	return pulled, g.registryWord(ctx, image, res, res.ConfigDigest.String(), false), nil
}

// hasImagePolicy reports whether an image policy is configured.
func (g *Guard) hasImagePolicy() bool {
	_, none := g.imagePolicy.(noImagePolicy)
	return !none
}

// errRuntimePull stands, inside the registry check, for the runtime's pull
// that failed: Verify answers with the runtime's own error.
var errRuntimePull = errors.New("the runtime's pull failed")

// policyRefusal is the image policy's refusal, ending a registry check: it
// reaches the pod as the policy words it.
type policyRefusal struct{ error }

func (p policyRefusal) Unwrap() error { return p.error }

// pullBeside runs the runtime's pull (forward) and the registry check of
// req beside it, and returns the runtime's image reference and the check's
// result once both are done. With req.Resolved (the image policy's
// verdict on the manifest the registry names), the runtime's pull starts
// only once it allowed it: a refusal before then leaves the node as it
// was. A check that ends first with a refusal stops the pull (and waits
// for it to end), marking run stopped when the runtime had not answered;
// a pull that fails is answered with the runtime's own error.
func (g *Guard) pullBeside(ctx context.Context, run *pullRun, req registry.Request, forward Forward) (string, registry.Result, error) {
	image := run.image
	if err := g.noteIntent(run); err != nil {
		return "", registry.Result{}, err
	}
	type outcome struct {
		ref     string
		err     error
		started bool
	}
	if g.manifests != nil {
		req.RuntimeManifest = g.manifests.Manifest
	}
	pullCtx, stop := context.WithCancel(ctx)
	defer stop()
	allowed := make(chan struct{})
	if req.Resolved == nil {
		close(allowed)
	} else {
		resolved := req.Resolved
		req.Resolved = func(ctx context.Context, manifest digest.Digest) error {
			if err := resolved(ctx, manifest); err != nil {
				return err
			}
			close(allowed)
			return nil
		}
	}
	done := make(chan outcome, 1)
	go func() {
		select {
		case <-allowed:
		case <-pullCtx.Done():
		}
		if err := pullCtx.Err(); err != nil {
			done <- outcome{err: err} // never asked: nothing to settle of this try
			return
		}
		ref, err := forward(pullCtx)
		if err == nil {
			crireq.LearnPullRef(g.runtime, ref)
		}
		done <- outcome{ref, err, true}
	}()
	var out outcome
	waited := false
	req.Pulled = func(ctx context.Context) (registry.PulledImage, error) {
		select {
		case out = <-done:
			waited = true
		case <-ctx.Done():
			return registry.PulledImage{}, ctx.Err()
		}
		if out.err != nil {
			return registry.PulledImage{}, errRuntimePull
		}
		return g.pulledImage(context.WithoutCancel(ctx), image, run.repo, out.ref)
	}
	res, err := g.registry.Check(ctx, req)
	if !waited {
		// The check ended first (a refusal, the registry unreachable, the
		// image policy): the runtime's pull is not wanted; it ends.
		select {
		case out = <-done: // it had answered already: its word is known
		default:
			stop()
			out = <-done
		}
	}
	if out.started && cutShort(pullCtx, out.err) {
		// Stopped (by the proxy or its caller) before it answered:
		// containerd goes on after its client's cancel and may create the
		// image a moment later.
		run.stopped = true
	}
	switch {
	case waited && out.err != nil:
		return "", res, out.err // the runtime's own answer: injection may try the next credential
	case errors.As(err, new(policyRefusal)):
		return "", res, err // the image policy's, as it words it for the pod
	case err != nil:
		return "", res, g.checkFailed(ctx, image, err)
	case !waited:
		return "", res, fmt.Errorf("pulling %s: the registry check ended without the runtime's pull: %w", image, errdefs.ErrInternal)
	}
	id := g.imageID(context.WithoutCancel(ctx), image, out.ref)
	if err := crireq.PulledAsAnswered(image, id, res.ConfigDigest); err != nil {
		g.log.WarnContext(ctx, "ensure: the runtime pulled another image than the registry answered; its credential is not recorded",
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
func (g *Guard) pulledImage(ctx context.Context, image, repo, ref string) (registry.PulledImage, error) {
	id := g.imageID(ctx, image, ref)
	p := registry.PulledImage{ImageID: crireq.IDDigest(id)}
	img, ok, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: id})
	if err != nil || !ok {
		// Not a word on the manifest: the registry's is taken whole.
		return p, nil
	}
	for _, name := range img.Names {
		if n := g.parse(name); n.OK && n.Repository == repo && n.Digest() != "" {
			if d, err := digest.Parse(n.Digest()); err == nil {
				p.ManifestDigests = append(p.ManifestDigests, d)
			}
		}
	}
	return p, nil
}

// registryWord is the registry's word a check gave, as Pull records it,
// said in the decision log.
func (g *Guard) registryWord(ctx context.Context, image string, res registry.Result, id string, fromNode bool) RegistryVerification {
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
	if g.log.Enabled(ctx, slog.LevelDebug) {
		g.log.DebugContext(ctx, "ensure decision", "decision", what, "image", image, "imageRef", id,
			"endpoint", res.Endpoint, "vouched", res.Vouched, "credential", res.CredentialKind,
			"manifest", res.ManifestDigest.String(), "blobsChecked", res.BlobsChecked, "blobs", checked, "requests", res.Requests,
			"layersProven", res.Proven, "bytesProven", res.ProvenBytes)
	}
	return v
}

// checkFailed is a refused try: the operator's log names the registry and
// the cause; the pod's owner reads registry.Refusal.
func (g *Guard) checkFailed(ctx context.Context, image string, err error) error {
	switch {
	case errors.Is(err, registry.ErrForged):
		g.log.WarnContext(ctx, "ensure: the registry served bytes that are not the image's content; the pull is refused", "image", image, "err", err)
	case errors.Is(err, registry.ErrDenied):
		g.log.InfoContext(ctx, "ensure: the registry refused the pull's credential", "image", image, "err", err)
	case errors.Is(err, registry.ErrMoved):
		g.log.InfoContext(ctx, "ensure: the registry's answer is not the image", "image", image, "err", err)
	case errors.Is(err, registry.ErrUnreachable):
		g.log.WarnContext(ctx, "ensure: the registry cannot be asked; the pull is refused until it can", "image", image, "err", err)
	}
	return registry.Refusal(image, err)
}
