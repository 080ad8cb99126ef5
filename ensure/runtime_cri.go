package ensure

import (
	"context"
	"encoding/json"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
)

// criImages is the part of the ImageService the enforcer asks, around the
// interceptors: the generated client satisfies it.
type criImages interface {
	ImageStatus(ctx context.Context, in *runtimeapi.ImageStatusRequest, opts ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error)
	ListImages(ctx context.Context, in *runtimeapi.ListImagesRequest, opts ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error)
}

// criSandboxes is the part of the RuntimeService the enforcer asks.
type criSandboxes interface {
	PodSandboxStatus(ctx context.Context, in *runtimeapi.PodSandboxStatusRequest, opts ...grpc.CallOption) (*runtimeapi.PodSandboxStatusResponse, error)
	ListPodSandbox(ctx context.Context, in *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error)
}

// CRIRuntime is the Runtime of a CRI runtime's clients (or anything with
// their methods: a fake in tests).
func CRIRuntime(images criImages, sandboxes criSandboxes) Runtime {
	return criRuntime{images, sandboxes}
}

type criRuntime struct {
	images    criImages
	sandboxes criSandboxes
}

func (r criRuntime) Image(ctx context.Context, q ImageQuery) (Image, bool, error) {
	resp, err := r.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: q.spec()})
	if err != nil || resp.GetImage() == nil {
		return Image{}, false, err
	}
	return imageOf(resp.Image), true, nil
}

// ImageLayers reads the image's config from a verbose ImageStatus: the
// runtime's "info" entry. containerd (1.6, 1.7 and 2.x alike) puts there a
// JSON object whose "imageSpec" is the image's OCI config, rootfs.diff_ids
// included (and "chainID", the top layer's chain ID). CRI-O answers
// verbose status with other info, and other runtimes may give none: then
// ok is false, and the layers count as unseen.
func (r criRuntime) ImageLayers(ctx context.Context, imageID string) ([]digest.Digest, bool, error) {
	resp, err := r.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: imageID}, Verbose: true})
	if err != nil {
		return nil, false, err
	}
	if resp.GetImage().GetId() != imageID {
		return nil, false, nil // another image (a prefix), or none
	}
	diffIDs, ok := diffIDsOfInfo(resp.GetInfo()["info"])
	return diffIDs, ok, nil
}

// diffIDsOfInfo reads rootfs.diff_ids from containerd's verbose image
// info; false when it is not there or not valid.
func diffIDsOfInfo(info string) ([]digest.Digest, bool) {
	if info == "" {
		return nil, false
	}
	var v struct {
		ImageSpec *struct {
			RootFS struct {
				Type    string          `json:"type"`
				DiffIDs []digest.Digest `json:"diff_ids"`
			} `json:"rootfs"`
		} `json:"imageSpec"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil || v.ImageSpec == nil || v.ImageSpec.RootFS.Type != "layers" {
		return nil, false
	}
	for _, d := range v.ImageSpec.RootFS.DiffIDs {
		if d.Validate() != nil {
			return nil, false
		}
	}
	return v.ImageSpec.RootFS.DiffIDs, true
}

func (r criRuntime) Images(ctx context.Context) ([]Image, error) {
	resp, err := r.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(resp.GetImages()))
	for _, img := range resp.GetImages() {
		out = append(out, imageOf(img))
	}
	return out, nil
}

func (r criRuntime) PodUID(ctx context.Context, sandboxID string) (string, error) {
	st, err := r.sandboxes.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		return "", err
	}
	return st.GetStatus().GetMetadata().GetUid(), nil
}

func (r criRuntime) PodUIDs(ctx context.Context) (map[string]bool, error) {
	resp, err := r.sandboxes.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	alive := map[string]bool{}
	for _, p := range resp.GetItems() {
		alive[p.GetMetadata().GetUid()] = true
	}
	return alive, nil
}

// imageOf is a CRI image in the enforcer's terms.
func imageOf(img *runtimeapi.Image) Image {
	names := make([]string, 0, len(img.GetRepoTags())+len(img.GetRepoDigests()))
	names = append(names, img.GetRepoTags()...)
	names = append(names, img.GetRepoDigests()...)
	return Image{ID: img.GetId(), Names: names}
}

// authOf is a CRI auth in the enforcer's terms.
func authOf(a *runtimeapi.AuthConfig) Auth {
	return Auth{Username: a.GetUsername(), Password: a.GetPassword(), Auth: a.GetAuth(), IdentityToken: a.GetIdentityToken(), RegistryToken: a.GetRegistryToken()}
}

// podOf is the pod a CRI sandbox config names.
func podOf(sc *runtimeapi.PodSandboxConfig) Pod {
	p := imagepolicy.PodFromSandbox(sc)
	return Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID, Static: p.Static}
}

// queryOf is a CRI image spec in the enforcer's terms.
func queryOf(spec *runtimeapi.ImageSpec) ImageQuery {
	return ImageQuery{Name: spec.GetImage(), UserSpecified: spec.GetUserSpecifiedImage(), RuntimeHandler: spec.GetRuntimeHandler(), Annotations: spec.GetAnnotations()}
}

// spec is the CRI image spec of q.
func (q ImageQuery) spec() *runtimeapi.ImageSpec {
	return &runtimeapi.ImageSpec{Image: q.Name, UserSpecifiedImage: q.UserSpecified, RuntimeHandler: q.RuntimeHandler, Annotations: q.Annotations}
}
