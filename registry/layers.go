package registry

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
)

// Layer is one layer of an image: the blob its manifest names, and the
// digest of its uncompressed content that the image's config lists
// (rootfs.diff_ids). A runtime shares layers by their diff_id (containerd
// reuses a snapshot whose chain ID the config's diff_ids give, without
// fetching the blob), so the diff_id is what a layer is on a node.
type Layer struct {
	Blob   ocispec.Descriptor
	DiffID digest.Digest
}

// LayerChooser is given the layers of the image a check resolved, read
// from its config (whose bytes the check fetched and verified), and names
// those whose content the registry must prove by serving their bytes for
// this credential in this repository. It runs before the check's blob
// round ends; an error fails the check as it is.
type LayerChooser func(ctx context.Context, imageID digest.Digest, layers []Layer) ([]digest.Digest, error)

// imageConfig is what a check reads of an image's config.
type imageConfig struct {
	RootFS struct {
		Type    string          `json:"type"`
		DiffIDs []digest.Digest `json:"diff_ids"`
	} `json:"rootfs"`
}

// layersOf pairs a manifest's layer blobs with the config's diff_ids, as
// containerd's unpacker does (in order, one each): a config and a manifest
// that disagree cannot be unpacked, and are no answer.
func layersOf(config []byte, blobs []ocispec.Descriptor) ([]Layer, error) {
	diffIDs, err := diffIDsOfConfig(config)
	if err != nil {
		return nil, err
	}
	if len(diffIDs) != len(blobs) {
		return nil, fmt.Errorf("the config lists %d layers, the manifest %d", len(diffIDs), len(blobs))
	}
	layers := make([]Layer, len(blobs))
	for i, b := range blobs {
		layers[i] = Layer{Blob: b, DiffID: diffIDs[i]}
	}
	return layers, nil
}

// diffIDsOfConfig is an image config's rootfs.diff_ids, each valid.
func diffIDsOfConfig(config []byte) ([]digest.Digest, error) {
	var c imageConfig
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("the config is not an image config: %v", err)
	}
	for i, d := range c.RootFS.DiffIDs {
		if err := d.Validate(); err != nil {
			return nil, fmt.Errorf("diff_id %d: %v", i, err)
		}
	}
	return c.RootFS.DiffIDs, nil
}

// reasonForgedLayer is the pod's reason for a forged layer: short, no
// digest (the operator's detail has them). A forged config's is in
// config.go.
const reasonForgedLayer = "the registry's bytes are not the image's layer"

// proveLayers fetches each layer of want (diff_ids) from the repository
// and verifies that its bytes are the blob the manifest names and that
// they decompress to the diff_id: what the runtime would check had it
// fetched the layer instead of reusing the node's copy. The bytes are
// streamed and discarded; each is bounded by the checker's proof bounds.
func (k *check) proveLayers(ctx context.Context, layers []Layer, want []digest.Digest) error {
	byDiff := make(map[digest.Digest]Layer, len(layers))
	for _, l := range layers {
		byDiff[l.DiffID] = l
	}
	var todo []Layer
	seen := map[digest.Digest]bool{}
	for _, d := range want {
		l, ok := byDiff[d]
		if !ok {
			return failure(ErrUnreachable, "internal error", "asked to prove %s, which is no layer of the image", d)
		}
		if !seen[d] {
			seen[d] = true
			todo = append(todo, l)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, k.c.proofTimeout)
	defer cancel()
	ctx = withBodyLimit(ctx, k.c.maxProofBytes)
	sizes := make([]int64, len(todo))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(k.c.maxProofParallel)
	for i, l := range todo {
		g.Go(func() error {
			n, err := k.proveLayer(gctx, l)
			sizes[i] = n
			return err
		})
	}
	err := g.Wait()
	for i, l := range todo {
		if sizes[i] > 0 {
			k.res.ProvenBytes += sizes[i]
		}
		if err == nil {
			k.res.Proven = append(k.res.Proven, l.DiffID)
		}
	}
	regLabel, epLabel := k.c.labels.registry(k.name.registry), k.c.labels.endpoint(k.ep)
	if err == nil {
		k.c.metrics.proofs.WithLabelValues(regLabel, epLabel, proofProven).Add(float64(len(todo)))
		return nil
	}
	result := proofFailed
	var e *Error
	switch {
	case errors.Is(err, ErrForged):
		result = proofForged
	case errors.As(err, &e) && e.overBound:
		result = proofOverBound
	}
	k.c.metrics.proofs.WithLabelValues(regLabel, epLabel, result).Inc()
	return err
}

// proveLayer fetches one layer and checks its bytes; it returns how many
// bytes it read.
func (k *check) proveLayer(ctx context.Context, l Layer) (int64, error) {
	p := "/blobs/" + l.Blob.Digest.String()
	what := "GET " + k.name.repository + p
	decompress, ok := decompressorFor(l.Blob.MediaType)
	if !ok {
		// Nothing to prove with: a layer the registry does not serve
		// (non-distributable), or a format the runtime cannot unpack.
		return 0, failure(ErrDenied, "a layer cannot be proven", "%s: media type %q", what, l.Blob.MediaType)
	}
	resp, err := k.do(ctx, http.MethodGet, p, "")
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, statusFailure(what, resp)
	}
	defer resp.Body.Close()
	where := fmt.Sprintf("registry %s, repository %s: %s", k.name.registry, k.name.repository, what)
	if resp.ContentLength > k.c.maxProofBytes {
		return 0, overProofBound("%s: %d bytes, over the %d byte bound of registryCheck.maxProofBytes", where, resp.ContentLength, k.c.maxProofBytes)
	}
	blob := l.Blob.Digest.Algorithm().Digester()
	counted := &countingReader{r: io.TeeReader(resp.Body, blob.Hash())}
	if k.c.inflations.known(l) {
		return k.proveKnownLayer(counted, blob, l, what, where)
	}
	diff := l.DiffID.Algorithm().Digester()
	// The decompressed side has its own bound: a small blob may inflate to
	// terabytes, which the compressed bound does not stop and the proof's
	// timeout stops only after minutes of CPU.
	inflated := &boundedWriter{w: diff.Hash(), left: k.c.maxUncompressed}
	err = decompress(counted, inflated)
	// Read what the decompressor left (padding, a trailer it did not need),
	// so that the blob's digest covers the whole answer.
	if err == nil {
		_, err = io.Copy(io.Discard, counted)
	}
	switch {
	case errors.Is(counted.err, errBodyTooLarge):
		return counted.n, overProofBound("%s: over the %d byte bound of registryCheck.maxProofBytes", where, k.c.maxProofBytes)
	case ctx.Err() != nil:
		return counted.n, transportFailure(what, ctx.Err())
	case counted.err != nil:
		// The answer could not be read to its end: the connection, not the
		// bytes, failed.
		return counted.n, transportFailure(what, counted.err)
	case errors.Is(err, errInflatedTooLarge):
		return counted.n, overProofBound("%s: decompresses past the %d byte bound of registryCheck.maxProofUncompressedBytes (stopped after %d compressed bytes)", where, k.c.maxUncompressed, counted.n)
	case errors.Is(err, zstd.ErrWindowSizeExceeded), errors.Is(err, zstd.ErrDecoderSizeExceeded):
		return counted.n, overProofBound("%s: a zstd frame asks for a window over %d bytes, which the zstd command does not decompress either without --memory (windowLog 27)", where, maxZstdWindow)
	case err != nil:
		// The bytes do not decompress as their media type says: no layer
		// the runtime could unpack, so not the diff_id the config names.
		return counted.n, forgery(reasonForgedLayer, "%s: the bytes do not decompress as %s: %v", where, l.Blob.MediaType, err)
	case blob.Digest() != l.Blob.Digest:
		return counted.n, forgery(reasonForgedLayer, "%s: %d bytes whose digest is %s, not the blob %s", where, counted.n, blob.Digest(), l.Blob.Digest)
	case diff.Digest() != l.DiffID:
		return counted.n, forgery(reasonForgedLayer, "%s: the blob decompresses to %s, not the config's diff_id %s", where, diff.Digest(), l.DiffID)
	}
	k.c.inflations.add(l)
	return counted.n, nil
}

// proveKnownLayer proves a layer whose blob this checker has seen
// decompress to its diff_id before: the registry must still serve the
// blob's bytes in this repository for this credential (its bytes, not a
// HEAD, are the proof), but what they decompress to is a fact about the
// bytes, so they are hashed, not inflated again. A node's pods share base
// layers: in a storm of new images most proofs are of the same few blobs,
// and inflating them was a fifth of the proxy's CPU.
func (k *check) proveKnownLayer(counted *countingReader, blob digest.Digester, l Layer, what, where string) (int64, error) {
	_, err := io.Copy(io.Discard, counted)
	switch {
	case errors.Is(counted.err, errBodyTooLarge):
		return counted.n, overProofBound("%s: over the %d byte bound of registryCheck.maxProofBytes", where, k.c.maxProofBytes)
	case err != nil:
		return counted.n, transportFailure(what, err)
	case blob.Digest() != l.Blob.Digest:
		return counted.n, forgery(reasonForgedLayer, "%s: %d bytes whose digest is %s, not the blob %s", where, counted.n, blob.Digest(), l.Blob.Digest)
	}
	return counted.n, nil
}

// inflationMemory remembers layers whose blob was seen, by this process,
// to decompress (as its media type says) to its diff_id: facts about
// bytes, true whoever serves them, kept for the most recent
// maxInflations layers.
type inflationMemory struct {
	mu    sync.Mutex
	pairs map[inflation]struct{}
	order []inflation // a ring, oldest at next
	next  int
}

// inflation is what a layer's decompression depends on: its blob's
// digest, its media type (how it is decompressed), and the diff_id.
type inflation struct {
	blob      digest.Digest
	mediaType string
	diffID    digest.Digest
}

const maxInflations = 4096

func inflationOf(l Layer) inflation {
	return inflation{blob: l.Blob.Digest, mediaType: l.Blob.MediaType, diffID: l.DiffID}
}

func (m *inflationMemory) known(l Layer) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.pairs[inflationOf(l)]
	return ok
}

func (m *inflationMemory) add(l Layer) {
	p := inflationOf(l)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pairs == nil {
		m.pairs = make(map[inflation]struct{})
	}
	if _, ok := m.pairs[p]; ok {
		return
	}
	if len(m.order) < maxInflations {
		m.order = append(m.order, p)
	} else {
		delete(m.pairs, m.order[m.next])
		m.order[m.next] = p
		m.next = (m.next + 1) % maxInflations
	}
	m.pairs[p] = struct{}{}
}

// decompressorFor is how a layer of a media type is turned into the tar
// stream its diff_id names, as containerd's unpacker reads it.
func decompressorFor(mediaType string) (func(io.Reader, io.Writer) error, bool) {
	switch {
	case strings.Contains(mediaType, "nondistributable"), strings.Contains(mediaType, "foreign"):
		return nil, false
	case strings.HasSuffix(mediaType, "+gzip"), strings.HasSuffix(mediaType, ".tar.gzip"), mediaType == "application/vnd.docker.image.rootfs.diff.tar.gzip":
		return func(r io.Reader, w io.Writer) error {
			zr, err := gzip.NewReader(r)
			if err != nil {
				return err
			}
			defer zr.Close()
			// A gzip stream may hold several members; containerd reads them all.
			_, err = io.Copy(w, zr)
			return err
		}, true
	case strings.HasSuffix(mediaType, "+zstd"):
		return func(r io.Reader, w io.Writer) error {
			// A frame names its window, and the decoder allocates it whole
			// at the frame's first block (klauspost's default accepts up to
			// 512 MiB; lowmem does not bound it): the window, and the memory
			// a single-segment frame's declared size makes the decoder
			// take, are bounded as the zstd command bounds them.
			zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(maxZstdWindow))
			if err != nil {
				return err
			}
			defer zr.Close()
			_, err = io.Copy(w, zr)
			return err
		}, true
	case mediaType == ocispec.MediaTypeImageLayer, mediaType == "application/vnd.docker.image.rootfs.diff.tar":
		return func(r io.Reader, w io.Writer) error {
			_, err := io.Copy(w, r)
			return err
		}, true
	}
	return nil, false
}

// maxZstdWindow bounds the window a zstd frame of a proven layer may ask
// for, which the decoder allocates: 128 MiB, windowLog 27, the zstd
// command's default limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT), which covers
// every level it compresses at, --ultra -22 and --long included. A layer
// with a larger window is one the reference tool will not decompress
// without --memory; each proof in flight holds at most this much (and two
// blocks) for its window.
const maxZstdWindow = 1 << 27

// errInflatedTooLarge is a layer decompressing past its bound.
var errInflatedTooLarge = errors.New("decompressed past the proof bound")

// boundedWriter passes on at most left bytes, then fails every write
// with errInflatedTooLarge, which stops the decompressor writing to it.
type boundedWriter struct {
	w    io.Writer
	left int64
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > b.left {
		n, err := b.w.Write(p[:b.left])
		b.left -= int64(n)
		if err == nil {
			err = errInflatedTooLarge
		}
		return n, err
	}
	n, err := b.w.Write(p)
	b.left -= int64(n)
	return n, err
}

// countingReader counts what it reads and keeps the first error of the
// reader under it (not io.EOF): a failure to read the answer, told apart
// from bytes that do not decompress.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// bodyLimitKey carries a request's own bound on its answer's body, for the
// check's transport: layers are proven past the manifests' bound.
type bodyLimitKey struct{}

func withBodyLimit(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, bodyLimitKey{}, n)
}

func bodyLimit(ctx context.Context) int64 {
	if n, ok := ctx.Value(bodyLimitKey{}).(int64); ok {
		return n
	}
	return maxManifestBytes
}
