package ensure

import (
	"context"
	"encoding/json"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
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
	form := &crireq.IDForm{}
	return criRuntime{crireq.RuntimeImagesIn(images, form), images, sandboxes, form}
}

type criRuntime struct {
	image     crireq.Images
	images    criImages
	sandboxes criSandboxes
	// form is the runtime's way of writing image IDs: the guard keeps them
	// canonical, and asks (and answers for) the runtime in its own.
	form *crireq.IDForm
}

// LearnID notes the form of an ID the runtime answered (a pull's
// image_ref): crireq.ImageID.
func (r criRuntime) LearnID(id string) { r.form.Learn(id) }

// RuntimeID is an image ID as the runtime writes it.
func (r criRuntime) RuntimeID(id string) string { return r.form.Out(id) }

func (r criRuntime) Image(ctx context.Context, q crireq.ImageQuery) (crireq.Image, bool, error) {
	return r.image.Image(ctx, q)
}

// ImageLayers reads the image's config from a verbose ImageStatus: the
// runtime's "info" entry. containerd (1.6, 1.7 and 2.x alike) puts there a
// JSON object whose "imageSpec" is the image's OCI config, rootfs.diff_ids
// included (and "chainID", the top layer's chain ID). CRI-O answers
// verbose status with other info, and other runtimes may give none: then
// ok is false, and the layers count as unseen.
func (r criRuntime) ImageLayers(ctx context.Context, imageID string) ([]digest.Digest, bool, error) {
	resp, err := crireq.ImageStatusIn(ctx, r.images, r.form, crireq.ImageQuery{Name: imageID}, true)
	if err != nil {
		return nil, false, err
	}
	r.form.Learn(resp.GetImage().GetId())
	if imageref.CanonicalID(resp.GetImage().GetId()) != imageref.CanonicalID(imageID) {
		return nil, false, nil // another image (a prefix), or none
	}
	if diffIDs, ok := diffIDsOfInfo(resp.GetInfo()["info"]); ok {
		return diffIDs, true, nil
	}
	// CRI-O: the image's OCI config itself, under "imageSpec".
	diffIDs, ok := diffIDsOfConfig(resp.GetInfo()["imageSpec"])
	return diffIDs, ok, nil
}

// imageSpecRootFS is what the proxy reads of an OCI image config.
type imageSpecRootFS struct {
	RootFS struct {
		Type    string          `json:"type"`
		DiffIDs []digest.Digest `json:"diff_ids"`
	} `json:"rootfs"`
}

// diffIDs are the config's layers; false when it names none validly.
func (c *imageSpecRootFS) diffIDs() ([]digest.Digest, bool) {
	if c == nil || c.RootFS.Type != "layers" {
		return nil, false
	}
	for _, d := range c.RootFS.DiffIDs {
		if d.Validate() != nil {
			return nil, false
		}
	}
	return c.RootFS.DiffIDs, true
}

// diffIDsOfInfo reads rootfs.diff_ids from containerd's verbose image
// info; false when it is not there or not valid.
func diffIDsOfInfo(info string) ([]digest.Digest, bool) {
	if info == "" {
		return nil, false
	}
	var v struct {
		ImageSpec *imageSpecRootFS `json:"imageSpec"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil {
		return nil, false
	}
	return v.ImageSpec.diffIDs()
}

// diffIDsOfConfig reads rootfs.diff_ids from an OCI image config, as
// CRI-O gives it whole in its verbose image info's "imageSpec"; false when
// it is not there or not valid.
func diffIDsOfConfig(config string) ([]digest.Digest, bool) {
	if config == "" {
		return nil, false
	}
	var c imageSpecRootFS
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		return nil, false
	}
	return c.diffIDs()
}

func (r criRuntime) Images(ctx context.Context) ([]crireq.Image, error) {
	resp, err := r.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]crireq.Image, 0, len(resp.GetImages()))
	for _, img := range resp.GetImages() {
		r.form.Learn(img.GetId())
		out = append(out, crireq.ImageOf(img))
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

// authOf is a CRI auth in the enforcer's terms.
func authOf(a *runtimeapi.AuthConfig) Auth {
	return Auth{Username: a.GetUsername(), Password: a.GetPassword(), Auth: a.GetAuth(), IdentityToken: a.GetIdentityToken(), RegistryToken: a.GetRegistryToken()}
}
