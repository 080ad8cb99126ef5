package registry

import (
	"container/list"
	"encoding/json"
	"fmt"
	"mime"
	"sort"
	"strings"
	"sync"

	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const (
	mediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerIndex    = "application/vnd.docker.distribution.manifest.list.v2+json"

	// maxManifestBytes bounds a manifest or index body, as containerd's
	// resolver does (its MaxManifestSize is about 4 MiB).
	maxManifestBytes = 4 << 20
	// maxBlobs bounds the blobs of one image a check will HEAD: real
	// images have tens; a hostile manifest could list thousands.
	maxBlobs = 1024
	// maxIndexDepth bounds indexes within indexes.
	maxIndexDepth = 4
)

// acceptManifests is containerd's resolver's Accept header, so that a
// registry answers the check as it answers the runtime.
var acceptManifests = strings.Join([]string{
	mediaTypeDockerManifest, mediaTypeDockerIndex,
	ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex, "*/*",
}, ", ")

// manifest is a manifest or an index, parsed, with only what a check uses.
type manifest struct {
	index     bool
	manifests []ocispec.Descriptor // an index's
	config    ocispec.Descriptor   // a manifest's
	layers    []ocispec.Descriptor // a manifest's
}

// parseManifest reads a manifest or index body as containerd would: the
// body's own mediaType wins, then the media type the registry or the
// parent descriptor gave, then the shape. A body that is both, neither,
// a schema 1 manifest, or names an invalid digest is refused.
func parseManifest(body []byte, mediaType string) (*manifest, error) {
	var raw struct {
		SchemaVersion int                  `json:"schemaVersion"`
		MediaType     string               `json:"mediaType"`
		Config        *ocispec.Descriptor  `json:"config"`
		Layers        []ocispec.Descriptor `json:"layers"`
		Manifests     []ocispec.Descriptor `json:"manifests"`
		FSLayers      json.RawMessage      `json:"fsLayers"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("not a manifest: %v", err)
	}
	if raw.FSLayers != nil || raw.SchemaVersion == 1 {
		return nil, fmt.Errorf("a schema 1 manifest, which containerd 2 no longer pulls")
	}
	if raw.SchemaVersion != 2 {
		return nil, fmt.Errorf("schemaVersion %d, want 2", raw.SchemaVersion)
	}
	isManifest := raw.Config != nil || raw.Layers != nil
	if raw.Manifests != nil && isManifest {
		return nil, fmt.Errorf("both an index and a manifest")
	}
	mt := raw.MediaType
	if mt == "" {
		mt = mediaType
	}
	var m manifest
	switch mt {
	case ocispec.MediaTypeImageIndex, mediaTypeDockerIndex:
		if isManifest {
			return nil, fmt.Errorf("media type %s with a manifest's fields", mt)
		}
		m.index = true
	case ocispec.MediaTypeImageManifest, mediaTypeDockerManifest:
		if raw.Manifests != nil {
			return nil, fmt.Errorf("media type %s with an index's fields", mt)
		}
	default:
		if raw.MediaType != "" {
			return nil, fmt.Errorf("unsupported media type %q", raw.MediaType)
		}
		// A media type said nothing useful ("application/json"): the shape.
		m.index = raw.Manifests != nil
		if !m.index && !isManifest {
			return nil, fmt.Errorf("neither an index nor a manifest")
		}
	}
	if m.index {
		m.manifests = raw.Manifests
		for _, d := range m.manifests {
			if err := validDescriptor(d); err != nil {
				return nil, fmt.Errorf("index entry: %v", err)
			}
		}
		return &m, nil
	}
	if raw.Config == nil {
		return nil, fmt.Errorf("a manifest without a config")
	}
	m.config, m.layers = *raw.Config, raw.Layers
	for _, d := range append([]ocispec.Descriptor{m.config}, m.layers...) {
		if err := validDescriptor(d); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

func validDescriptor(d ocispec.Descriptor) error {
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("descriptor digest %q: %v", d.Digest, err)
	}
	if d.Size < 0 {
		return fmt.Errorf("descriptor %s: negative size", d.Digest)
	}
	return nil
}

// pickManifest chooses an index's entry for the platform as containerd's
// images.Manifest does: entries of the platform, and those that name none,
// the best match first, the unnamed last.
func pickManifest(entries []ocispec.Descriptor, platform platforms.MatchComparer) (ocispec.Descriptor, bool) {
	var descs []ocispec.Descriptor
	for _, d := range entries {
		if d.Platform == nil || platform.Match(*d.Platform) {
			descs = append(descs, d)
		}
	}
	if len(descs) == 0 {
		return ocispec.Descriptor{}, false
	}
	sort.SliceStable(descs, func(i, j int) bool {
		if descs[i].Platform == nil {
			return false
		}
		if descs[j].Platform == nil {
			return true
		}
		return platform.Less(*descs[i].Platform, *descs[j].Platform)
	})
	return descs[0], true
}

// isIndexType tells an index descriptor from a manifest's.
func isIndexType(mt string) bool {
	return mt == ocispec.MediaTypeImageIndex || mt == mediaTypeDockerIndex
}

// contentType is a response's media type without parameters.
func contentType(h string) string {
	mt, _, err := mime.ParseMediaType(h)
	if err != nil {
		return ""
	}
	return mt
}

// verifyDigest reports whether body is the content d names.
func verifyDigest(body []byte, d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("digest %q: %v", d, err)
	}
	if got := d.Algorithm().FromBytes(body); got != d {
		return fmt.Errorf("the body is %s, not %s", got, d)
	}
	return nil
}

// manifestCache holds manifests verified by their digest, parsed, up to a
// number of bytes of their bodies, the oldest dropped first.
// Content-addressed: a manifest is the same whoever fetched it, so it
// carries nothing of a credential; it saves fetching a manifest again,
// never the registry's word on whether a repository holds it for a
// credential (a check proves that with a HEAD).
//
// Each entry remembers where its bytes were served (an endpoint and a
// repository). Only there does a HEAD prove the manifest: a registry that
// answers every HEAD with 200 must serve the bytes once before a digest
// it names counts, else a digest leaked from another tenant's pull would
// be enough. Safe for concurrent use.
type manifestCache struct {
	mu    sync.Mutex
	max   int64
	bytes int64
	order *list.List // of digest.Digest, oldest at the front
	m     map[digest.Digest]cachedManifest
}

type cachedManifest struct {
	m    *manifest
	size int64
	// servedAt holds the "endpoint repository" places that served these
	// bytes; bounded by maxServedAt, past which it starts again.
	servedAt map[string]struct{}
}

// maxServedAt bounds the places remembered per manifest: a manifest shared
// by more repositories than this is fetched once more in the others.
const maxServedAt = 64

func newManifestCache(maxBytes int64) *manifestCache {
	return &manifestCache{max: maxBytes, order: list.New(), m: map[digest.Digest]cachedManifest{}}
}

// get is the manifest d, and whether its bytes were served at where.
func (c *manifestCache) get(d digest.Digest, where string) (m *manifest, servedHere bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[d]
	if !ok {
		return nil, false
	}
	_, servedHere = e.servedAt[where]
	return e.m, servedHere
}

// put stores m, parsed from a body of size bytes that the caller verified
// against d and that where served.
func (c *manifestCache) put(d digest.Digest, m *manifest, size int64, where string) {
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[d]; ok {
		if len(e.servedAt) >= maxServedAt {
			clear(e.servedAt)
		}
		e.servedAt[where] = struct{}{}
		return
	}
	for c.bytes+size > c.max {
		oldest := c.order.Front()
		od := oldest.Value.(digest.Digest)
		c.bytes -= c.m[od].size
		delete(c.m, od)
		c.order.Remove(oldest)
	}
	c.m[d] = cachedManifest{m: m, size: size, servedAt: map[string]struct{}{where: {}}}
	c.order.PushBack(d)
	c.bytes += size
}

// tagMemory remembers the digest each tag resolved to when a check last
// GOT its manifest, so that the next check can ask with a HEAD. It holds
// no credential; a HEAD answered for the credential is still required.
// Bounded: past maxTags it forgets everything. Safe for concurrent use.
type tagMemory struct {
	mu sync.Mutex
	m  map[string]digest.Digest
}

const maxTags = 4096

func (t *tagMemory) get(key string) (digest.Digest, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[key]
	return d, ok
}

func (t *tagMemory) put(key string, d digest.Digest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil || len(t.m) >= maxTags {
		t.m = map[string]digest.Digest{}
	}
	t.m[key] = d
}
