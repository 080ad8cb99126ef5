package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// RegistryCheck asks an image's own registry (never a mirror the operator
// did not vouch for) whether a credential can read the image in its
// repository, content-aware; *registry.Checker is the real one.
type RegistryCheck interface {
	Check(ctx context.Context, r registry.Request) (registry.Result, error)
	// ProveLayers proves layers a check returned by their bytes, later.
	ProveLayers(ctx context.Context, r registry.Request, layers []registry.Layer, want []digest.Digest) (registry.Result, error)
}

// Verify is the registry's word on one try of a pull: the credential it
// goes with, as the innermost hook sees it (the request's own, or the one
// credential injection put in), is checked at the image's registry before
// the runtime is asked. A pull that succeeded is no proof: a mirror in the
// runtime's hosts.toml may have answered it, or the runtime fetched
// nothing because the content was already on the node under another name.
//
//   - When the name stood for an image already on the node (the outer Pull
//     said so) and the registry resolves it, for this credential, to that
//     same image, with every blob readable in the repository, the pull is
//     answered from the node: no runtime pull.
//
//   - Otherwise the runtime pulls, and the image it pulled must be the one
//     the registry answered for this credential (else the tag moved in
//     between, or the runtime got it elsewhere).
//
//   - A registry that refuses, or cannot be asked, refuses the try (the
//     credential injection inside may try the next credential): no record,
//     the image stays hidden from the pod.
//
//   - With an image policy, each try is decided on the manifest digest the
//     registry resolved, before the runtime pulls (or the node answers);
//     the runtime's image must then be the one the registry answered, so
//     the pull is pinned to that digest: a tag moved in between is refused.
//     The verdict is bound to the image ID the pull produced.
//
// forward is the runtime's pull; it returns the image reference it
// answered. Verify returns the image ID to answer with.
func (g *Guard) Verify(ctx context.Context, image string, pod Pod, cred registry.Credential, forward Forward) (string, error) {
	present := pullreport.Present(ctx)
	repo, _ := g.repository(image)
	req := registry.Request{Image: image, ImageID: present, Credential: cred, Blobs: true,
		ProveLayers: g.layerChooser(ctx, image, repo, cred.Kind() == registry.KindAnonymous)}
	res, err := g.registry.Check(ctx, req)
	switch {
	case err == nil && present != "":
		// The layers the node shares are the present image's: what the
		// check proved stands, nothing was pulled meanwhile.
		v, err := g.imagePolicy.pull(ctx, image, pod, cred, res, present)
		if err != nil {
			return "", err
		}
		g.imagePolicy.bind(v, present)
		g.reportVerified(ctx, image, res, present, true)
		return present, nil
	case err == nil:
	case present != "" && errors.Is(err, registry.ErrMoved):
		// The tag moved since the image came to the node: the runtime pulls
		// the new one, which must be what the registry answers now.
		req.ImageID = ""
		if res, err = g.registry.Check(ctx, req); err != nil {
			return "", g.checkFailed(ctx, image, err)
		}
	default:
		return "", g.checkFailed(ctx, image, err)
	}
	v, err := g.imagePolicy.pull(ctx, image, pod, cred, res, "")
	if err != nil {
		return "", err
	}
	pulled, err := forward(ctx)
	if err != nil {
		return "", err
	}
	id := g.imageID(context.WithoutCancel(ctx), image, pulled)
	if !imageref.IsID(id) || digestOf(id) != res.ConfigDigest {
		g.log.WarnContext(ctx, "ensure: the runtime pulled another image than the registry answered; its credential is not recorded",
			"image", image, "pulled", id, "registry", res.Endpoint, "answered", res.ConfigDigest, "cause", "a tag moved, or the runtime got the image elsewhere")
		return "", fmt.Errorf("pulling %s: the image changed while it was pulled; retry: %w", image, errdefs.ErrAborted)
	}
	// The runtime may have built the image from layers another pull
	// brought meanwhile: those are proven now, before the pod is answered.
	reproven, err := g.reproveAfterPull(ctx, image, repo, cred, res)
	if err != nil {
		return "", err
	}
	res.Proven = append(res.Proven, reproven...)
	g.imagePolicy.bind(v, id)
	g.reportVerified(ctx, image, res, id, false)
	return pulled, nil
}

// reportVerified tells the outer Pull (and the decision log) the
// registry's word on the credential.
func (g *Guard) reportVerified(ctx context.Context, image string, res registry.Result, id string, fromNode bool) {
	var checked []string
	if res.BlobsChecked > 0 {
		for _, b := range res.Blobs[:min(len(res.Blobs), pullreport.MaxListedBlobs)] {
			checked = append(checked, b.String())
		}
	}
	pullreport.ReportVerified(ctx, pullreport.Verification{
		ImageID: id, Registry: res.Registry, Endpoint: res.Endpoint, Vouched: res.Vouched, CredentialKind: res.CredentialKind,
		ManifestDigest: res.ManifestDigest.String(), Blobs: res.BlobsChecked, CheckedBlobs: checked, Requests: res.Requests, FromNode: fromNode,
		Layers: diffIDsOf(res.Layers), LayersKnown: res.Layers != nil, ProvenLayers: res.Proven, ProvenBytes: res.ProvenBytes,
	})
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
}

// checkFailed is a refused try: the operator's log names the registry and
// the cause; the pod's owner reads registryRefusal.
func (g *Guard) checkFailed(ctx context.Context, image string, err error) error {
	switch {
	case errors.Is(err, registry.ErrDenied):
		g.log.InfoContext(ctx, "ensure: the registry refused the pull's credential", "image", image, "err", err)
	case errors.Is(err, registry.ErrMoved):
		g.log.InfoContext(ctx, "ensure: the registry's answer is not the image", "image", image, "err", err)
	case errors.Is(err, registry.ErrUnreachable):
		g.log.WarnContext(ctx, "ensure: the registry cannot be asked; the pull is refused until it can", "image", image, "err", err)
	}
	return registryRefusal(image, err)
}

// registryRefusal is a registry check that failed, as the client sees it:
// the image as the pod named it and the registry's short reason, nothing
// of another tenant's; a refusal is PermissionDenied, a registry that
// cannot be asked Unavailable, an answer that is not the image Aborted
// (retry).
func registryRefusal(image string, err error) error {
	var rerr *registry.Error
	reason := "the registry check could not be made"
	if errors.As(err, &rerr) && rerr.Reason != "" {
		reason = rerr.Reason
	}
	var code error
	switch {
	case errors.Is(err, registry.ErrDenied):
		code = errdefs.ErrPermissionDenied
	case errors.Is(err, registry.ErrMoved):
		code = errdefs.ErrAborted
	case errors.Is(err, registry.ErrUnreachable):
		code = errdefs.ErrUnavailable
	default:
		code = errdefs.ErrInvalidArgument
	}
	return fmt.Errorf("pulling %s: %s: %w", image, reason, code)
}

// digestOf is an image ID as a digest.
func digestOf(id string) digest.Digest {
	if d, err := digest.Parse(id); err == nil {
		return d
	}
	return digest.Digest("sha256:" + id)
}
