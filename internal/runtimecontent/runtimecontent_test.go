package runtimecontent

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// store is a content service holding blobs that arrive after some Info
// calls, as a pull's manifest arrives in containerd's store.
type store struct {
	contentapi.UnimplementedContentServer
	mu        sync.Mutex
	blobs     map[string][]byte
	arriveIn  int // Info calls answered NotFound before the blobs are there
	infos     int
	namespace string // of the last call
}

func (s *store) Info(ctx context.Context, req *contentapi.InfoRequest) (*contentapi.InfoResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("containerd-namespace")) > 0 {
		s.namespace = md.Get("containerd-namespace")[0]
	}
	s.infos++
	b, ok := s.blobs[req.GetDigest()]
	if !ok || s.infos <= s.arriveIn {
		return nil, status.Errorf(codes.NotFound, "content digest %s: not found", req.GetDigest())
	}
	return &contentapi.InfoResponse{Info: &contentapi.Info{Digest: req.GetDigest(), Size: int64(len(b))}}, nil
}

func (s *store) Read(req *contentapi.ReadContentRequest, srv contentapi.Content_ReadServer) error {
	s.mu.Lock()
	b := s.blobs[req.GetDigest()]
	s.mu.Unlock()
	for off := 0; off < len(b); off += 3 { // in several messages
		if err := srv.Send(&contentapi.ReadContentResponse{Offset: int64(off), Data: b[off:min(off+3, len(b))]}); err != nil {
			return err
		}
	}
	return nil
}

// serve serves s (nil: a server with no content service, as CRI-O's) on a
// unix socket and returns a connection to it.
func serve(t *testing.T, s *store) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "c.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if s != nil {
		contentapi.RegisterContentServer(srv, s)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestManifest(t *testing.T) {
	manifest := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}`)
	d := digest.FromBytes(manifest)
	t.Run("a manifest the runtime fetches a moment later is read once it is there, in containerd's k8s.io namespace", func(t *testing.T) {
		s := &store{blobs: map[string][]byte{d.String(): manifest}, arriveIn: 3}
		got, err := New(serve(t, s)).Manifest(context.Background(), d)
		if err != nil || string(got) != string(manifest) {
			t.Fatalf("got %q, %v", got, err)
		}
		if s.infos != 4 || s.namespace != Namespace {
			t.Errorf("%d Info calls in namespace %q, want 4 in %q", s.infos, s.namespace, Namespace)
		}
	})
	t.Run("a manifest that never arrives is waited for until the context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s := &store{blobs: map[string][]byte{}}
		done := make(chan error, 1)
		go func() { _, err := New(serve(t, s)).Manifest(ctx, d); done <- err }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want the context's end", err)
		}
	})
	t.Run("a runtime with no content API is unsupported, and asked once", func(t *testing.T) {
		r := New(serve(t, nil))
		for range 2 {
			if _, err := r.Manifest(context.Background(), d); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("got %v, want ErrUnsupported", err)
			}
		}
		if !r.unsupported.Load() {
			t.Error("not remembered as unsupported")
		}
	})
	t.Run("content over a manifest's bound is not read", func(t *testing.T) {
		big := make([]byte, maxManifestBytes+1)
		bd := digest.FromBytes(big)
		s := &store{blobs: map[string][]byte{bd.String(): big}}
		if _, err := New(serve(t, s)).Manifest(context.Background(), bd); err == nil {
			t.Fatal("read content over the bound")
		}
	})
}
