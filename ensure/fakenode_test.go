package ensure_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// fakeNode is containerd and a registry, as far as the guard can tell: a
// local image store, a registry that checks credentials per repository and
// counts its requests, and pod sandboxes.
type fakeNode struct {
	mu        sync.Mutex
	local     map[string]*runtimeapi.Image // normalized reference or ID -> image
	remote    map[string]string            // normalized reference -> image ID the registry serves
	allowed   map[string]map[string]bool   // repository -> "user:password" allowed ("" is anonymous)
	requests  int                          // registry requests
	sandboxes map[string]string            // sandbox ID -> pod UID
	statusErr error                        // when set, ImageStatus fails with it (the runtime down)
	// mirror makes the runtime's pulls go through a mirror that serves
	// every repository to anyone (a pull-through cache holding the
	// registry's credentials): its pulls succeed whatever the credential.
	mirror bool
	// registryErr, when set, is every registry check's answer (the
	// registry down); checks counts the checks asked.
	registryErr error
	checks      int
	// afterStatus, when set, runs after each ImageStatus answered, outside
	// the node's lock: a test's way to make something happen right then.
	afterStatus func(resp *runtimeapi.ImageStatusResponse)
	// layers are each image's diff_ids (default: one of its own, see
	// layersOf); holds the layers each repository serves the bytes of
	// (default: those of the images it serves); noConfig makes verbose
	// ImageStatus give no config (a runtime that does not say).
	layers   map[string][]digest.Digest
	holds    map[string]map[digest.Digest]bool
	noConfig bool
	proofs   int // layers fetched for a proof
	// duringPull, when set, runs while the runtime pulls, outside the lock;
	// afterPull when a pull stored its image.
	duringPull func()
	afterPull  func(id string)
	// checkGate, when set, holds every registry check's answer until it is
	// closed: a test's way to have the registry answer late.
	checkGate chan struct{}
	// listErr, when set, fails ListImages (the runtime not answering yet).
	listErr error
	// bareIDs makes the runtime write image IDs as bare hex, as CRI-O does.
	bareIDs bool
}

// out is img as the runtime answers it; n.mu is held.
func (n *fakeNode) out(img *runtimeapi.Image) *runtimeapi.Image {
	if !n.bareIDs || img == nil {
		return img
	}
	c := proto.CloneOf(img)
	c.Id = strings.TrimPrefix(c.Id, "sha256:")
	return c
}

// layersOf is image id's diff_ids; n.mu is held.
func (n *fakeNode) layersOf(id string) []digest.Digest {
	if l, ok := n.layers[id]; ok {
		return l
	}
	return []digest.Digest{digest.FromString("diff of " + id)}
}

// withLayers makes image id hold the layers given (its config's diff_ids).
func (n *fakeNode) withLayers(id string, diffIDs ...digest.Digest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.layers[id] = diffIDs
}

// serveBytes makes repository repo serve the bytes of the layers given.
func (n *fakeNode) serveBytes(repo string, diffIDs ...digest.Digest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.holds[repo] == nil {
		n.holds[repo] = map[digest.Digest]bool{}
	}
	for _, d := range diffIDs {
		n.holds[repo][d] = true
	}
}

func newFakeNode() *fakeNode {
	return &fakeNode{local: map[string]*runtimeapi.Image{}, remote: map[string]string{}, allowed: map[string]map[string]bool{}, sandboxes: map[string]string{},
		layers: map[string][]digest.Digest{}, holds: map[string]map[digest.Digest]bool{}}
}

func norm(s string) string {
	n, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return s
	}
	return reference.TagNameOnly(n).String()
}

// serve makes the registry serve image (name:tag) as id to the credentials.
func (n *fakeNode) serve(image, id string, creds ...string) {
	n.remote[norm(image)] = id
	repo, _ := reference.ParseNormalizedNamed(image)
	if n.allowed[repo.Name()] == nil {
		n.allowed[repo.Name()] = map[string]bool{}
	}
	for _, c := range creds {
		n.allowed[repo.Name()][c] = true
	}
	if n.holds[repo.Name()] == nil {
		n.holds[repo.Name()] = map[digest.Digest]bool{}
	}
	for _, d := range n.layersOf(id) {
		n.holds[repo.Name()][d] = true
	}
}

// preload puts image on the node without any pull (baked in the node image).
func (n *fakeNode) preload(image, id string) { n.store(norm(image), id) }

func (n *fakeNode) store(ref, id string) {
	img := n.local[id]
	if img == nil {
		img = &runtimeapi.Image{Id: id, Size: 1}
		n.local[id] = img
	}
	img.RepoTags = append(img.RepoTags, ref)
	n.local[ref] = img
}

func (n *fakeNode) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error) {
	resp, err := n.imageStatus(req)
	if err == nil && req.GetVerbose() && resp.GetImage() != nil {
		n.mu.Lock()
		switch config := map[string]any{"rootfs": map[string]any{"type": "layers", "diff_ids": n.layersOf("sha256:" + strings.TrimPrefix(resp.Image.Id, "sha256:"))}}; {
		case n.noConfig:
		case n.bareIDs:
			// As CRI-O: the image's config itself, under "imageSpec".
			spec, _ := json.Marshal(config)
			resp = &runtimeapi.ImageStatusResponse{Image: resp.Image, Info: map[string]string{"imageSpec": string(spec)}}
		default:
			info, _ := json.Marshal(map[string]any{"chainID": "sha256:x", "imageSpec": config})
			resp = &runtimeapi.ImageStatusResponse{Image: resp.Image, Info: map[string]string{"info": string(info)}}
		}
		n.mu.Unlock()
	}
	n.mu.Lock()
	after := n.afterStatus
	n.mu.Unlock()
	if after != nil && err == nil {
		after(resp)
	}
	return resp, err
}

func (n *fakeNode) imageStatus(req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.statusErr != nil {
		return nil, n.statusErr
	}
	name := req.GetImage().GetImage()
	if _, err := reference.ParseNormalizedNamed(name); err != nil && strings.Trim(strings.TrimPrefix(name, "sha256:"), "0123456789abcdef") != "" {
		return nil, status.Errorf(codes.InvalidArgument, "invalid image reference %q", name)
	}
	if img := n.local[name]; img != nil {
		return &runtimeapi.ImageStatusResponse{Image: n.out(img)}, nil
	}
	if img := n.local[norm(name)]; img != nil {
		return &runtimeapi.ImageStatusResponse{Image: n.out(img)}, nil
	}
	// As containerd: a name that is no reference it holds may be an ID, in
	// full or a prefix of one.
	if len(name) >= 12 {
		for k, img := range n.local {
			if strings.HasPrefix(k, "sha256:"+strings.TrimPrefix(name, "sha256:")) {
				return &runtimeapi.ImageStatusResponse{Image: n.out(img)}, nil
			}
		}
	}
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (n *fakeNode) ListImages(context.Context, *runtimeapi.ListImagesRequest, ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listErr != nil {
		return nil, n.listErr
	}
	seen := map[string]bool{}
	resp := &runtimeapi.ListImagesResponse{}
	for _, img := range n.local {
		if !seen[img.Id] {
			seen[img.Id] = true
			resp.Images = append(resp.Images, n.out(img))
		}
	}
	return resp, nil
}

func (n *fakeNode) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	n.mu.Lock()
	during := n.duringPull
	n.mu.Unlock()
	if during != nil {
		during()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.requests++
	ref := norm(req.GetImage().GetImage())
	named, _ := reference.ParseNormalizedNamed(ref)
	a := req.GetAuth()
	cred := ""
	if a != nil {
		cred = a.GetUsername() + ":" + a.GetPassword()
	}
	id, ok := n.remote[ref]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%s: not found", ref)
	}
	if !n.mirror && !n.allowed[named.Name()][cred] {
		return nil, status.Errorf(codes.Unknown, "pulling %s: 401 Unauthorized", ref)
	}
	if img := n.local[ref]; img == nil || img.Id != id {
		n.store(ref, id) // the name now stands for what the registry serves
	}
	if img := n.local[id]; !slices.Contains(img.RepoDigests, named.Name()+"@"+manifestDigest(id)) {
		img.RepoDigests = append(img.RepoDigests, named.Name()+"@"+manifestDigest(id))
	}
	if after := n.afterPull; after != nil {
		n.mu.Unlock()
		after(id)
		n.mu.Lock()
	}
	if n.bareIDs {
		id = strings.TrimPrefix(id, "sha256:")
	}
	return &runtimeapi.PullImageResponse{ImageRef: id}, nil
}

func (n *fakeNode) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	img := n.local[req.GetImage().GetImage()]
	if img == nil {
		img = n.local[norm(req.GetImage().GetImage())]
	}
	if img != nil {
		for k, v := range n.local {
			if v == img {
				delete(n.local, k)
			}
		}
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

func (n *fakeNode) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	return &runtimeapi.CreateContainerResponse{ContainerId: "ctr-" + req.GetSandboxConfig().GetMetadata().GetUid()}, nil
}

func (n *fakeNode) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.sandboxes, req.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (n *fakeNode) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest, _ ...grpc.CallOption) (*runtimeapi.PodSandboxStatusResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	uid, ok := n.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no sandbox")
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: req.GetPodSandboxId(), Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}}}, nil
}

func (n *fakeNode) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	resp := &runtimeapi.ListPodSandboxResponse{}
	for id, uid := range n.sandboxes {
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{Id: id, Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}})
	}
	return resp, nil
}

func (n *fakeNode) registryRequests() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.requests
}

// pod is a pod as the kubelet describes it over CRI.
type pod struct {
	uid   string
	creds []*runtimeapi.AuthConfig // its pull secrets' credentials, in keyring order
	// ns is its namespace, "ns" when empty; static makes it a static pod.
	ns     string
	static bool
}

func (p pod) sandbox() *runtimeapi.PodSandboxConfig {
	ns := p.ns
	if ns == "" {
		ns = "ns"
	}
	sc := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + p.uid, Namespace: ns, Uid: p.uid}}
	if p.static {
		sc.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	}
	return sc
}

func cred(userPass string) *runtimeapi.AuthConfig {
	u, p, _ := strings.Cut(userPass, ":")
	return &runtimeapi.AuthConfig{Username: u, Password: p}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// put makes image (name:tag) present as id, as a pull that completed does.
func (n *fakeNode) put(image, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ref := norm(image); n.local[ref] == nil {
		n.store(ref, id)
	}
}

// has reports whether the node holds the image id.
func (n *fakeNode) has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.local[id] != nil
}

// setListErr makes every ListImages fail with err (nil: answer again).
func (n *fakeNode) setListErr(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.listErr = err
}

// setStatusErr makes every ImageStatus fail with err (nil: answer again).
func (n *fakeNode) setStatusErr(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.statusErr = err
}

// Check is the registry's own word (ensure.RegistryCheck): the image's
// registry, never the mirror, resolves the name for the credential.
func (n *fakeNode) Check(ctx context.Context, r registry.Request) (registry.Result, error) {
	n.mu.Lock()
	gate := n.checkGate
	n.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return registry.Result{}, &registry.Error{Kind: registry.ErrUnreachable, Reason: "the check was cancelled"}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.checks++
	if n.registryErr != nil {
		return registry.Result{}, n.registryErr
	}
	ref := norm(r.Image)
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return registry.Result{}, fmt.Errorf("not a reference: %w", err)
	}
	cred := ""
	if r.Credential != (registry.Credential{}) {
		cred = r.Credential.Username + ":" + r.Credential.Password
	}
	id, ok := n.remote[ref]
	if !ok || !n.allowed[named.Name()][cred] {
		return registry.Result{}, &registry.Error{Kind: registry.ErrDenied, Endpoint: "https://registry.test/v2", Reason: "not authorized"}
	}
	res := registry.Result{Registry: "registry.test", Endpoint: "https://registry.test/v2", Repository: named.Name(),
		ManifestDigest: digest.Digest(manifestDigest(id)), ImageManifest: digest.Digest(manifestDigest(id)), ConfigDigest: digest.Digest(id),
		CredentialKind: r.Credential.Kind(), BlobsChecked: 2, Requests: 3,
		Blobs: []digest.Digest{digest.Digest(id), digest.FromString("layer of " + id)}}
	for _, d := range n.layersOf(id) {
		res.Layers = append(res.Layers, registry.Layer{Blob: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("blob of " + d.String())}, DiffID: d})
	}
	if r.ImageID != "" && r.ImageID != id {
		return res, &registry.Error{Kind: registry.ErrMoved, Endpoint: res.Endpoint, Reason: "the tag moved"}
	}
	// The rest runs outside the lock: the hooks ask the node.
	n.mu.Unlock()
	defer n.mu.Lock()
	if r.Beside != nil {
		// Beside the runtime's pull: the registry's word first, then what
		// the runtime holds must be what it names.
		if err := r.Beside.Resolved(ctx, res.ManifestDigest); err != nil {
			return res, err
		}
		p, err := r.Beside.Pulled(ctx)
		if err != nil {
			return res, err
		}
		if !slices.Contains(p.ManifestDigests, res.ManifestDigest) {
			return res, &registry.Error{Kind: registry.ErrMoved, Endpoint: res.Endpoint, Reason: "the image changed while it was pulled"}
		}
	}
	if r.ProveLayers == nil {
		return res, nil
	}
	want, err := r.ProveLayers(ctx, digest.Digest(id), res.Layers)
	if err != nil {
		return res, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proveLocked(named.Name(), res, want)
}

// proveLocked serves the layers want of repo's bytes, as a proof; n.mu is
// held.
func (n *fakeNode) proveLocked(repo string, res registry.Result, want []digest.Digest) (registry.Result, error) {
	for _, d := range want {
		n.proofs++
		if !n.holds[repo][d] {
			return res, &registry.Error{Kind: registry.ErrDenied, Endpoint: res.Endpoint, Reason: "a layer's bytes are not its content"}
		}
		res.Proven = append(res.Proven, d)
		res.ProvenBytes += 100
	}
	return res, nil
}

func (n *fakeNode) layerProofs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proofs
}

// manifestDigest is the manifest digest the fake registry serves image id
// under, and the runtime records as its repo digest.
func manifestDigest(id string) string { return digest.FromString("manifest of " + id).String() }

func (n *fakeNode) registryChecks() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.checks
}
