package registry

import (
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/platforms"
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
		config, err = k.heads(cctx, nil, &ocispec.Descriptor{Digest: p.ImageID}, nil)
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

// errNoEarlyConfig: the config was not asked beside the runtime's pull
// (no manifest from the runtime, or another config than it pulled).
var errNoEarlyConfig = errors.New("no config asked beside the pull")

// earlyConfig is the registry's answer for a config asked beside the
// runtime's pull.
type earlyConfig struct {
	done   chan struct{}
	cancel context.CancelFunc
	digest digest.Digest // the config asked; "" when none
	body   []byte
	err    error
}

// configEarly asks the registry for the config of the manifest d (the
// registry's word for the reference) as soon as the runtime's store holds
// that manifest (RuntimePull.Manifest), beside the rest of the runtime's
// pull. When the store cannot be read, it asks nothing.
func (k *check) configEarly(ctx context.Context, spec ocispec.Platform, r Request, d digest.Digest) *earlyConfig {
	e := &earlyConfig{done: make(chan struct{})}
	ctx, e.cancel = context.WithCancel(ctx)
	go func() {
		defer close(e.done)
		config, err := k.configOf(ctx, spec, r.Beside, d)
		if err != nil {
			return // asked once the pull ended, as without it
		}
		cctx, cancel := context.WithTimeout(ctx, k.c.timeout)
		defer cancel()
		e.digest = config
		e.body, e.err = k.heads(cctx, nil, &ocispec.Descriptor{Digest: config}, nil)
	}()
	return e
}

// stop ends the early question, if it still runs.
func (e *earlyConfig) stop() {
	if e.cancel != nil {
		e.cancel()
	}
}

// wait returns the registry's answer for the config imageID when it was
// asked early, and errNoEarlyConfig otherwise.
func (e *earlyConfig) wait(imageID digest.Digest) ([]byte, error) {
	if e.cancel == nil {
		return nil, errNoEarlyConfig
	}
	<-e.done
	e.cancel()
	if e.digest != imageID {
		// Another config than the runtime holds (or none): the runtime's
		// image decides what is asked.
		return nil, errNoEarlyConfig
	}
	return e.body, e.err
}

// configOf is the config digest of the manifest d for the platform, read
// from the runtime's store (an index leads to the platform's manifest),
// each verified against its digest.
func (k *check) configOf(ctx context.Context, spec ocispec.Platform, store RuntimePull, d digest.Digest) (digest.Digest, error) {
	for depth := 0; depth <= maxIndexDepth; depth++ {
		body, err := store.Manifest(ctx, d)
		if err != nil {
			return "", err
		}
		if err := verifyDigest(body, d); err != nil {
			return "", err
		}
		m, err := parseManifest(body, "")
		if err != nil {
			return "", err
		}
		if !m.index {
			return m.config.Digest, nil
		}
		desc, ok := pickManifest(m.manifests, platforms.Only(spec))
		if !ok {
			return "", errors.New("no manifest for this platform")
		}
		d = desc.Digest
	}
	return "", errors.New("indexes nested too deep")
}
