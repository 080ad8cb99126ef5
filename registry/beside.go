package registry

import (
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// errNoDigest is a HEAD of a reference answered without the digest it
// names: the registry's word is then had by a GET.
var errNoDigest = errors.New("the answer names no digest")

// runBeside is the check of a pull the runtime makes at the same time
// (Request.Beside): the registry's word on the reference by HEAD (a GET
// only when the HEAD names no digest), then, once the runtime pulled, the
// config by its bytes, where the runtime's manifest is the one the
// registry named. Otherwise (a tag that moved, the runtime's manifest
// from elsewhere), and where a layer must be proven (which needs the
// manifest's blobs), the whole check runs on the runtime's image.
func (k *check) runBeside(ctx context.Context, spec ocispec.Platform, r Request) error {
	ctx = docker.ContextWithAppendPullRepositoryScope(ctx, k.name.repository)
	// Each question to the registry is bounded by the check's timeout;
	// the wait for the runtime's pull is the caller's.
	hctx, cancel := context.WithTimeout(ctx, k.c.timeout)
	d, err := k.headReference(hctx)
	if errors.Is(err, errNoDigest) {
		_, d, _, err = k.resolve(hctx)
	}
	cancel()
	if err != nil {
		return err
	}
	k.c.labels.earn(k.name.registry, k.ep)
	k.res.ManifestDigest = d
	if err := r.Beside.Resolved(ctx, d); err != nil {
		return err
	}
	early := k.configEarly(ctx, spec, r, d)
	// A pull that failed, or holds another manifest, asks no config: the
	// early question (still waiting for a manifest that is not coming)
	// ends with the check.
	defer early.stop()
	p, err := r.Beside.Pulled(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(p.ManifestDigests, d) {
		// The runtime holds another manifest than the registry names for
		// this credential: the tag moved meanwhile, or the runtime got it
		// elsewhere (a mirror). What the registry names was decided on
		// (image policy); what the runtime holds was not.
		return failure(ErrMoved, "the image changed while it was pulled", "%s names manifest %s; the runtime holds %v", k.name, d, p.ManifestDigests)
	}
	k.res.ConfigDigest = p.ImageID
	k.res.Blobs = []digest.Digest{p.ImageID}
	config, err := early.wait(p.ImageID)
	if errors.Is(err, errNoEarlyConfig) {
		cctx, cancel := context.WithTimeout(ctx, k.c.timeout)
		config, err = k.fetchConfig(cctx, p.ImageID)
		cancel()
	}
	if err != nil {
		return err
	}
	// The config lists the layers (diff_ids); their blobs are the
	// manifest's, which the runtime fetched and the check has not.
	diffIDs, err := diffIDsOfConfig(config)
	if err != nil {
		return failure(ErrUnreachable, "invalid answer", "image %s: %v", p.ImageID, err)
	}
	layers := make([]Layer, len(diffIDs))
	for i, dd := range diffIDs {
		layers[i] = Layer{DiffID: dd}
	}
	k.res.Layers = layers
	if r.ProveLayers == nil {
		return nil
	}
	want, err := r.ProveLayers(ctx, p.ImageID, layers)
	if err != nil || len(want) == 0 {
		return err
	}
	// Proving a layer needs its blob: the manifest, fetched (the whole
	// check), gives them, and the layers decided are proven.
	k.res.Layers, k.res.BlobsChecked = nil, 0
	return k.run(ctx, p.ImageID, spec, true, func(context.Context, digest.Digest, []Layer) ([]digest.Digest, error) { return want, nil })
}

// headReference asks the registry, for the credential, which manifest the
// reference names: a HEAD, its Docker-Content-Digest (for a digest
// reference, that digest). errNoDigest when the answer names none (some
// registries do not say on a HEAD, or refuse one).
func (k *check) headReference(ctx context.Context) (digest.Digest, error) {
	p := "/manifests/" + k.name.object
	what := "HEAD " + k.name.repository + p
	resp, err := k.do(ctx, http.MethodHead, p, acceptManifests)
	if err != nil {
		return "", err
	}
	discard(resp)
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return "", errNoDigest
	default:
		if isRedirect(resp.StatusCode) {
			return "", errNoDigest
		}
		return "", statusFailure(what, resp)
	}
	h := resp.Header.Get("Docker-Content-Digest")
	if h == "" {
		return "", errNoDigest
	}
	d, err := digest.Parse(h)
	if err != nil {
		return "", failure(ErrUnreachable, "invalid answer", "%s: Docker-Content-Digest %.80q: %v", what, h, err)
	}
	if k.name.digest != "" && d != k.name.digest {
		return "", failure(ErrUnreachable, "invalid answer", "%s: names %s, not the digest asked for", what, d)
	}
	return d, nil
}
