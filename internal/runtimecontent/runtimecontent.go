package runtimecontent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrUnsupported: the runtime has no content API (it is not containerd).
var ErrUnsupported = errors.New("the runtime has no content store to read")

// Namespace is containerd's namespace of the images its CRI plugin pulls.
const Namespace = "k8s.io"

// maxManifestBytes bounds what is read: a manifest or an index is
// kilobytes.
const maxManifestBytes = 4 << 20

// The wait for a manifest the runtime has not fetched yet: asked again
// after firstPoll, doubling up to maxPoll (a manifest comes in the pull's
// first round trips; a long pull of layers then costs few questions).
const (
	firstPoll = 2 * time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// Reader reads manifests from containerd's content store. It is safe for
// concurrent use.
type Reader struct {
	client      contentapi.ContentClient
	unsupported atomic.Bool
}

// New returns a Reader over conn, a connection to containerd's socket.
func New(conn grpc.ClientConnInterface) *Reader {
	return &Reader{client: contentapi.NewContentClient(conn)}
}

// Manifest returns the bytes of the blob d once the runtime's store holds
// them, waiting until then or until ctx ends. The caller verifies them
// against d.
func (r *Reader) Manifest(ctx context.Context, d digest.Digest) ([]byte, error) {
	if r.unsupported.Load() {
		return nil, ErrUnsupported
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", Namespace)
	wait := firstPoll
	for {
		info, err := r.client.Info(ctx, &contentapi.InfoRequest{Digest: d.String()})
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch status.Code(err) {
		case codes.OK:
			return r.read(ctx, d, info.GetInfo().GetSize())
		case codes.Unimplemented:
			r.unsupported.Store(true)
			return nil, ErrUnsupported
		case codes.NotFound:
		default:
			return nil, fmt.Errorf("content %s: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, maxPoll)
	}
}

func (r *Reader) read(ctx context.Context, d digest.Digest, size int64) ([]byte, error) {
	if size > maxManifestBytes {
		return nil, fmt.Errorf("content %s: %d bytes, over the %d byte bound of a manifest", d, size, maxManifestBytes)
	}
	stream, err := r.client.Read(ctx, &contentapi.ReadContentRequest{Digest: d.String()})
	if err != nil {
		return nil, fmt.Errorf("content %s: %w", d, err)
	}
	var out []byte
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("content %s: %w", d, err)
		}
		out = append(out, resp.GetData()...)
		if int64(len(out)) > maxManifestBytes {
			return nil, fmt.Errorf("content %s: over the %d byte bound of a manifest", d, maxManifestBytes)
		}
	}
}
