package criproxy

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// MaxMessageSize is the largest message the proxy accepts or sends, each
// way: 16 MiB, like the kubelet's CRI client and containerd.
const MaxMessageSize = 16 << 20

// Backend is the container runtime the proxy forwards to. Image is the
// connection for the ImageService and is the same as Runtime unless a
// separate image endpoint is configured (the kubelet's
// --image-service-endpoint). It is safe for concurrent use.
type Backend struct {
	Runtime *grpc.ClientConn
	Image   *grpc.ClientConn

	// RuntimeEndpoint and ImageEndpoint are the normalised endpoints.
	RuntimeEndpoint, ImageEndpoint string
}

// Dial connects to the runtime. imageEndpoint may be empty. Connections are
// made lazily and re-made after the runtime restarts: while it is away,
// calls fail with Unavailable and nothing needs restarting.
func Dial(runtimeEndpoint, imageEndpoint string) (*Backend, error) {
	rt, err := ParseEndpoint(runtimeEndpoint)
	if err != nil {
		return nil, fmt.Errorf("runtime endpoint %q: %w", runtimeEndpoint, err)
	}
	img := rt
	if imageEndpoint != "" {
		if img, err = ParseEndpoint(imageEndpoint); err != nil {
			return nil, fmt.Errorf("image endpoint %q: %w", imageEndpoint, err)
		}
	}
	b := &Backend{RuntimeEndpoint: rt, ImageEndpoint: img}
	if b.Runtime, err = dial(rt); err != nil {
		return nil, err
	}
	b.Image = b.Runtime
	if img != rt {
		if b.Image, err = dial(img); err != nil {
			b.Runtime.Close()
			return nil, err
		}
	}
	return b, nil
}

func dial(endpoint string) (*grpc.ClientConn, error) {
	return grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
		// Reconnect quickly once the runtime is back: a restart of containerd
		// takes a second or two and the kubelet retries on its own.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// Keep the connection: the first call after an idle period would
		// otherwise pay for a new one.
		grpc.WithIdleTimeout(0),
		// The proxy reads a whole message before it forwards it: with the
		// default 64 KiB windows a large answer (ListImages of a busy node)
		// waits for window updates on this hop as well as on the caller's.
		// Messages are bounded by MaxMessageSize anyway.
		grpc.WithInitialWindowSize(MaxMessageSize),
		grpc.WithInitialConnWindowSize(MaxMessageSize),
	)
}

// ParseEndpoint accepts "unix:///path" or an absolute path, as the kubelet
// and crictl do on Linux, and returns the "unix:///path" form.
func ParseEndpoint(endpoint string) (string, error) {
	path := endpoint
	switch {
	case endpoint == "":
		return "", fmt.Errorf("endpoint is empty")
	case strings.HasPrefix(endpoint, "unix://"):
		path = strings.TrimPrefix(endpoint, "unix://")
	case strings.Contains(endpoint, "://"):
		return "", fmt.Errorf("only unix sockets are supported, as unix:///path/to.sock")
	}
	// "unix://relative/path" is a common slip.
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("the socket path must be absolute, as unix:///path/to.sock")
	}
	// gRPC reads the endpoint as a URL: these would change the path it dials.
	if strings.ContainsAny(path, "?#%") {
		return "", fmt.Errorf("the socket path must not contain ?, # or %%")
	}
	return "unix://" + filepath.Clean(path), nil
}

// conn returns the connection that serves fullMethod.
func (b *Backend) conn(fullMethod string) *grpc.ClientConn {
	if isImageService(fullMethod) {
		return b.Image
	}
	return b.Runtime
}

// Ready reports whether the runtime answers: Version on the runtime
// endpoint and, when the image endpoint is separate, ImageFsInfo there.
func (b *Backend) Ready(ctx context.Context) error {
	if _, err := runtimeapi.NewRuntimeServiceClient(b.Runtime).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		return fmt.Errorf("runtime %s: Version: %w", b.RuntimeEndpoint, err)
	}
	if b.Image != b.Runtime {
		if _, err := runtimeapi.NewImageServiceClient(b.Image).ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{}); err != nil {
			return fmt.Errorf("image service %s: ImageFsInfo: %w", b.ImageEndpoint, err)
		}
	}
	return nil
}

// Close closes the connections.
func (b *Backend) Close() error {
	err := b.Runtime.Close()
	if b.Image != b.Runtime {
		if ierr := b.Image.Close(); err == nil {
			err = ierr
		}
	}
	return err
}
