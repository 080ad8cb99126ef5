package registry

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// zeros is n bytes of zeros: a layer's content that compresses to almost
// nothing, the stuff of a decompression bomb.
func zeros(n int) []byte { return make([]byte, n) }

func gzipOf(t *testing.T, content []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdOf(t *testing.T, content []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(content, nil)
}

// zstdFrameOfZeros is a zstd frame that declares a window of 1<<windowLog
// bytes (no content size, so the window is what the decoder goes by) and
// holds n zeros in RLE blocks: valid zstd, a few bytes per 128 KiB.
func zstdFrameOfZeros(windowLog uint, n int) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x28, 0xb5, 0x2f, 0xfd}) // magic
	b.WriteByte(0)                          // frame header descriptor: no content size, not single-segment, no checksum, no dictionary
	b.WriteByte(byte(windowLog-10) << 3)    // window descriptor: exponent, no mantissa
	const maxBlock = 128 << 10
	for n > 0 {
		size := min(n, maxBlock)
		n -= size
		header := uint32(size)<<3 | 1<<1 // an RLE block of size bytes
		if n == 0 {
			header |= 1 // the last block
		}
		var h [4]byte
		binary.LittleEndian.PutUint32(h[:], header)
		b.Write(h[:3])
		b.WriteByte(0) // the byte repeated
	}
	return b.Bytes()
}

func TestTheZstdFrameBuilderWritesValidZstd(t *testing.T) {
	zr, err := zstd.NewReader(bytes.NewReader(zstdFrameOfZeros(20, 300<<10)))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	got, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(got, zeros(300<<10)) {
		t.Fatalf("decoded %d bytes, %v; want 300 KiB of zeros", len(got), err)
	}
}

// TestAProofIsBoundedInWhatItDecompresses: a layer proof stops at the
// decompressed bound (a decompression bomb: a small blob that inflates
// without end) and at a zstd window larger than the zstd command takes,
// failing closed as over the proof bound (not as a forgery: the bytes may
// be the content), before it burns the CPU or the memory; an honest layer
// at the bound still proves.
func TestAProofIsBoundedInWhatItDecompresses(t *testing.T) {
	ctx := context.Background()
	const bound = 1 << 20 // the test's decompressed bound: 1 MiB
	bomb := zeros(8 << 20)
	for _, tc := range []struct {
		name      string
		content   []byte // what the layer decompresses to: its diff_id
		mediaType string
		blob      func(t *testing.T, content []byte) []byte
		opts      Options
		// wantOver: refused as over the proof bound; else proven.
		wantOver bool
		// detail is what the operator reads of the bound.
		detail string
	}{
		{
			name:    "a gzip bomb (8 MiB of zeros in a few KiB) fails closed at a 1 MiB bound",
			content: bomb, mediaType: ocispec.MediaTypeImageLayerGzip, blob: gzipOf,
			opts: Options{MaxProofUncompressedBytes: bound}, wantOver: true,
			detail: "decompresses past the 1048576 byte bound of registryCheck.maxProofUncompressedBytes",
		},
		{
			name:    "a zstd bomb (8 MiB of zeros in a few hundred bytes) fails closed at a 1 MiB bound",
			content: bomb, mediaType: ocispec.MediaTypeImageLayerZstd, blob: zstdOf,
			opts: Options{MaxProofUncompressedBytes: bound}, wantOver: true,
			detail: "decompresses past the 1048576 byte bound of registryCheck.maxProofUncompressedBytes",
		},
		{
			name:    "an uncompressed layer past the decompressed bound fails closed",
			content: bomb, mediaType: ocispec.MediaTypeImageLayer, blob: func(_ *testing.T, c []byte) []byte { return c },
			opts: Options{MaxProofUncompressedBytes: bound}, wantOver: true,
			detail: "registryCheck.maxProofUncompressedBytes",
		},
		{
			name:    "the same gzip bomb proves under the default bound: the bound, not the bytes, refused it",
			content: bomb, mediaType: ocispec.MediaTypeImageLayerGzip, blob: gzipOf,
		},
		{
			name:    "the same zstd bomb proves under the default bound",
			content: bomb, mediaType: ocispec.MediaTypeImageLayerZstd, blob: zstdOf,
		},
		{
			name:    "an honest gzip layer of exactly the bound proves",
			content: bytes.Repeat([]byte("an honest layer's file "), bound/23+1)[:bound], mediaType: ocispec.MediaTypeImageLayerGzip, blob: gzipOf,
			opts: Options{MaxProofUncompressedBytes: bound},
		},
		{
			name:    "an honest zstd layer of exactly the bound proves",
			content: bytes.Repeat([]byte("an honest layer's file "), bound/23+1)[:bound], mediaType: ocispec.MediaTypeImageLayerZstd, blob: zstdOf,
			opts: Options{MaxProofUncompressedBytes: bound},
		},
		{
			name:    "a gzip layer one byte past the bound fails closed",
			content: zeros(bound + 1), mediaType: ocispec.MediaTypeImageLayerGzip, blob: gzipOf,
			opts: Options{MaxProofUncompressedBytes: bound}, wantOver: true,
			detail: "registryCheck.maxProofUncompressedBytes",
		},
		{
			name:    "a zstd frame with a 128 MiB window, the zstd command's own limit, proves",
			content: zeros(256 << 10), mediaType: ocispec.MediaTypeImageLayerZstd, blob: func(_ *testing.T, c []byte) []byte { return zstdFrameOfZeros(27, len(c)) },
		},
		{
			name:    "a zstd frame asking for a 256 MiB window fails closed",
			content: zeros(256 << 10), mediaType: ocispec.MediaTypeImageLayerZstd, blob: func(_ *testing.T, c []byte) []byte { return zstdFrameOfZeros(28, len(c)) },
			wantOver: true, detail: "a zstd frame asks for a window over 134217728 bytes",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := newLyingRegistry(t)
			blob := tc.blob(t, tc.content)
			layer := ocispec.Descriptor{MediaType: tc.mediaType, Digest: lr.Blob("b/app", blob), Size: int64(len(blob))}
			cfg, desc := imageConfigOf(t, tc.name, digest.FromBytes(tc.content))
			lr.Blob("b/app", cfg)
			image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{layer}})
			reg := prometheus.NewRegistry()
			tc.opts.Registerer = reg
			res, err := newTestChecker(t, tc.opts).Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
			if !tc.wantOver {
				if err != nil || len(res.Proven) != 1 {
					t.Fatalf("got %v, proven %v; want the layer proven", err, res.Proven)
				}
				return
			}
			assertOverTheProofBound(t, reg, res, err, tc.detail)
		})
	}
}

// TestAZstdWindowIsRefusedBeforeItIsAllocated: a frame may declare a 512
// MiB window, which klauspost's decoder takes by default (its limit is
// 512 MiB, and lowmem does not bound it) and allocates whole at the
// frame's first block. The proof refuses the frame at its header: the
// check's heap stays small.
func TestAZstdWindowIsRefusedBeforeItIsAllocated(t *testing.T) {
	ctx := context.Background()
	content := zeros(64 << 10)
	lr := newLyingRegistry(t)
	blob := zstdFrameOfZeros(29, len(content)) // 512 MiB
	layer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerZstd, Digest: lr.Blob("b/app", blob), Size: int64(len(blob))}
	cfg, desc := imageConfigOf(t, "window", digest.FromBytes(content))
	lr.Blob("b/app", cfg)
	image := lr.manifest(t, "b/app", "v1", ocispec.Manifest{Config: desc, Layers: []ocispec.Descriptor{layer}})
	reg := prometheus.NewRegistry()
	c := newTestChecker(t, Options{Registerer: reg})

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := c.Check(ctx, Request{Image: image, Blobs: true, ProveLayers: chooseAll})
	runtime.ReadMemStats(&after)

	// Everything the check allocated, freed or not: a window would be
	// 512 MiB at once.
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 32<<20 {
		t.Errorf("the check allocated %d MiB: the frame's window was allocated", allocated>>20)
	}
	assertOverTheProofBound(t, reg, res, err, "a zstd frame asks for a window over 134217728 bytes")
}

// assertOverTheProofBound: the check failed closed as over the proof
// bound, not as a forgery, the operator reading detail, and the proofs
// metric counting it over_bound.
func assertOverTheProofBound(t *testing.T, reg prometheus.Gatherer, res Result, err error, detail string) {
	t.Helper()
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrForged) || errors.Is(err, ErrDenied) {
		t.Fatalf("got %v; want it over the proof bound (ErrUnreachable), not forged", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Reason != "a layer is over the proof bound" || !strings.Contains(e.Error(), detail) {
		t.Errorf("got %v; want the pod to read that a layer is over the proof bound, the operator %q", err, detail)
	}
	if len(res.Proven) != 0 {
		t.Errorf("proven %v past the bound", res.Proven)
	}
	if n := countOf(t, reg, "cri_image_proxy_registry_layer_proofs_total", proofOverBound); n != 1 {
		t.Errorf("proofs counted over_bound: %v, want 1", n)
	}
	if n := countOf(t, reg, "cri_image_proxy_registry_checks_total", resultForged); n != 0 {
		t.Errorf("checks counted forged: %v, want 0", n)
	}
}
