package cri_test

import (
	"context"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// node is the runtime and the images' registry, as far as the hooks can
// tell: the registry serves each name as an image ID (its manifest digest
// manifestDigest(id)), and the runtime holds what was pulled or put, by
// name and by ID, listed under its name and its repo digest.
type node struct {
	mu     sync.Mutex
	remote map[string]string        // normalized reference -> image ID the registry serves
	local  map[string]*crireq.Image // normalized reference or ID -> image
	// registryErr, when set, is every registry check's answer;
	// statusErr every runtime question's (the runtime down).
	registryErr error
	statusErr   error
	checks      int // registry checks
	pulls       int // the runtime's pulls
}

func newNode() *node {
	return &node{remote: map[string]string{}, local: map[string]*crireq.Image{}}
}

func norm(image string) string {
	if n, ok := imageref.Normalized(image); ok {
		return n
	}
	return image
}

// manifestDigest is the manifest digest the registry serves image id
// under, and the runtime records as its repo digest.
func manifestDigest(id string) string { return digest.FromString("manifest of " + id).String() }

// serve makes the registry serve image (name:tag) as id.
func (n *node) serve(image, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.remote[norm(image)] = id
}

// put makes image (name:tag) present as id, as a pull that completed
// does.
func (n *node) put(image, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.putLocked(image, id)
}

func (n *node) putLocked(image, id string) {
	ref := norm(image)
	img := n.local[id]
	if img == nil {
		img = &crireq.Image{ID: id}
		n.local[id] = img
	}
	repo, _ := imageref.Repository(ref)
	img.Names = append(img.Names, ref, repo+"@"+manifestDigest(id))
	n.local[ref] = img
}

// Image answers as the runtime's ImageStatus (crireq.Images).
func (n *node) Image(_ context.Context, q crireq.ImageQuery) (crireq.Image, bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.statusErr != nil {
		return crireq.Image{}, false, n.statusErr
	}
	img := n.local[q.Name]
	if img == nil {
		img = n.local[norm(q.Name)]
	}
	if img == nil {
		return crireq.Image{}, false, nil
	}
	return *img, true, nil
}

// Check is the image's registry resolving a name (cri.Registry).
func (n *node) Check(_ context.Context, r registry.Request) (registry.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.checks++
	if n.registryErr != nil {
		return registry.Result{}, n.registryErr
	}
	id, ok := n.remote[norm(r.Image)]
	if !ok {
		return registry.Result{}, &registry.Error{Kind: registry.ErrDenied, Endpoint: "https://registry.test/v2", Reason: "not found"}
	}
	return registry.Result{Endpoint: "https://registry.test/v2", ManifestDigest: digest.Digest(manifestDigest(id)), ConfigDigest: digest.Digest(id)}, nil
}

// PullImage is the runtime's pull: the image the registry serves now.
func (n *node) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pulls++
	id, ok := n.remote[norm(req.GetImage().GetImage())]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%s: not found", req.GetImage().GetImage())
	}
	n.putLocked(req.GetImage().GetImage(), id)
	return &runtimeapi.PullImageResponse{ImageRef: id}, nil
}

func (n *node) CreateContainer(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	return &runtimeapi.CreateContainerResponse{ContainerId: "ctr"}, nil
}

func (n *node) counts() (checks, pulls int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.checks, n.pulls
}

// pod is a pod as the kubelet describes it over CRI.
type pod struct{ uid, ns string }

func (p pod) sandbox() *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + p.uid, Namespace: p.ns, Uid: p.uid}}
}

const (
	signedImage   = "registry.test/public/signed:v1"
	unsignedImage = "registry.test/public/unsigned:v1"
	refSigned     = "sha256:5555555555555555555555555555555555555555555555555555555555555555"
	refUnsigned   = "sha256:6666666666666666666666666666666666666666666666666666666666666666"
)

var (
	podSecure = pod{uid: "s1", ns: "secure"}
	podOther  = pod{uid: "o1", ns: "other"}
)

// contains reports whether err's message holds each of want.
func contains(err error, want ...string) bool {
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			return false
		}
	}
	return true
}
