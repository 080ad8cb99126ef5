package registry

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// check is one Check's state: its endpoint, its own HTTP client (which
// counts and times its requests) and its own authorizer. Tokens live in
// that authorizer and die with the check: nothing fetched with one
// credential ever serves another's check.
type check struct {
	c            *Checker
	name         imageName
	cred         Credential
	res          *Result
	ep           *endpoint
	client       *http.Client
	observe      prometheus.Observer
	requests     atomic.Int64
	manifestGets atomic.Int64

	mu   sync.Mutex
	auth *authState
}

func (k *check) start(ctx context.Context, ep *endpoint) {
	k.ep = ep
	k.observe = k.c.metrics.requests.WithLabelValues(k.c.labels.registry(k.name.registry), k.c.labels.endpoint(ep))
	base := ep.host.Client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	k.client = &http.Client{Transport: &checkTransport{base: base, k: k}, CheckRedirect: checkRedirect}
	k.auth = &authState{}
	if ch, ok := k.c.challenges.get(ep.String()); ok {
		k.auth = k.newAuthState(ctx, ch)
	}
}

// run resolves the reference, picks the platform's manifest, compares its
// config with imageID and, with blobs, fetches the config (its bytes
// verified), proves each layer present, and proves by their bytes the
// layers chooser names.
func (k *check) run(ctx context.Context, imageID digest.Digest, spec ocispec.Platform, blobs bool, chooser LayerChooser) error {
	platform := platforms.Only(spec)
	// The token scope, as containerd's resolver asks it.
	ctx = docker.ContextWithAppendPullRepositoryScope(ctx, k.name.repository)
	// The registry's answers are bounded; the proof of layers (its own
	// bound) and the caller's question are not by this.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, k.c.timeout)
	defer cancel()
	// Manifests taken from the cache that the registry was not asked for in
	// this check: a HEAD must show the repository holds them for this
	// credential.
	var prove []digest.Digest

	m, d, asked, err := k.resolve(ctx)
	if err != nil {
		return err
	}
	// The endpoint answered the reference as a registry does: it may name
	// its own metric series from now on (within the bound).
	k.c.labels.earn(k.name.registry, k.ep)
	if !asked {
		prove = append(prove, d)
	}
	k.res.ManifestDigest = d
	for depth := 0; m.index; depth++ {
		if depth == maxIndexDepth {
			return failure(ErrUnreachable, "invalid answer", "indexes nested deeper than %d", maxIndexDepth)
		}
		desc, ok := pickManifest(m.manifests, platform)
		if !ok {
			return failure(ErrMoved, "no image for this platform", "index %s has no manifest for %s", d, platforms.Format(spec))
		}
		var fetched bool
		if m, fetched, err = k.manifestByDigest(ctx, desc); err != nil {
			return err
		}
		if !fetched && blobs {
			prove = append(prove, desc.Digest)
		}
		d = desc.Digest
	}
	k.res.ImageManifest, k.res.ConfigDigest = d, m.config.Digest
	k.res.Blobs = append(k.res.Blobs, m.config.Digest)
	for _, b := range m.layers {
		k.res.Blobs = append(k.res.Blobs, b.Digest)
	}
	if imageID != "" && m.config.Digest != imageID {
		return failure(ErrMoved, "the reference resolves to another image", "%s resolves to image %s, not %s", k.name, m.config.Digest, imageID)
	}
	if !blobs {
		// Resolving only: prove holds the reference itself, when it came
		// from the cache.
		if len(prove) == 0 {
			return nil
		}
		_, err := k.blobRound(ctx, prove, nil, nil)
		return err
	}
	// One round: the config's bytes (GET), and a HEAD of each layer and of
	// each manifest taken from the cache.
	config, err := k.blobRound(ctx, prove, &m.config, m.layers)
	if err != nil {
		return err
	}
	layers, err := layersOf(config, m.layers)
	if err != nil {
		return failure(ErrUnreachable, "invalid answer", "image %s: %v", m.config.Digest, err)
	}
	k.res.Layers = layers
	if chooser == nil {
		return nil
	}
	cancel()
	want, err := chooser(parent, m.config.Digest, layers)
	if err != nil {
		return err
	}
	return k.proveLayers(parent, layers, want)
}
