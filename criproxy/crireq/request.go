package crireq

import (
	"fmt"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Pod names the pod a CRI call is for, as the kubelet gives it (the
// sandbox's metadata); the zero Pod is a call for no pod (crictl, bake).
type Pod struct {
	Namespace, Name, UID string
	// Static: a static pod (the kubelet's config.source annotation), for
	// image policy plugins.
	Static bool
}

// String names the pod for the operator's log.
func (p Pod) String() string {
	if p == (Pod{}) {
		return "(no pod)"
	}
	return p.Namespace + "/" + p.Name + " (uid " + p.UID + ")"
}

// configSourceAnnotation is where the kubelet says where a pod came from
// (kubetypes.ConfigSourceAnnotationKey): "api" for pods of the API
// server, "file" or "http" for static pods. The kubelet copies a pod's
// annotations into its sandbox config.
const configSourceAnnotation = "kubernetes.io/config.source"

// PodOf is the pod a CRI sandbox config names: namespace, name and UID
// from its metadata, static from the kubelet's config.source annotation.
// A nil config (crictl pull without --pod-config) is no pod.
func PodOf(sc *runtimeapi.PodSandboxConfig) Pod {
	md := sc.GetMetadata()
	src := sc.GetAnnotations()[configSourceAnnotation]
	return Pod{Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid(), Static: src == "file" || src == "http"}
}

// ImageQuery names an image as a request does.
type ImageQuery struct {
	Name           string // the name, image ID or ID prefix
	UserSpecified  string // the name the pod gave, when the request carries it
	RuntimeHandler string
	Annotations    map[string]string
}

// QueryOf is a CRI image spec as a query.
func QueryOf(spec *runtimeapi.ImageSpec) ImageQuery {
	return ImageQuery{Name: spec.GetImage(), UserSpecified: spec.GetUserSpecifiedImage(), RuntimeHandler: spec.GetRuntimeHandler(), Annotations: spec.GetAnnotations()}
}

// spec is the CRI image spec of q.
func (q ImageQuery) spec() *runtimeapi.ImageSpec {
	return &runtimeapi.ImageSpec{Image: q.Name, UserSpecifiedImage: q.UserSpecified, RuntimeHandler: q.RuntimeHandler, Annotations: q.Annotations}
}

// ImageUse is one image a container would see, and where the request
// names it.
type ImageUse struct {
	Image ImageQuery
	Field string // "image", "mounts[2].image": for the operator's log
}

// Shown is the image as the pod named it: what its owner may be told.
func (u ImageUse) Shown() string {
	if u.Image.UserSpecified != "" {
		return u.Image.UserSpecified
	}
	return u.Image.Name
}

// CreateShape checks that a CreateContainer names what a decision on its
// images needs: a missing part is the caller's mistake (InvalidArgument,
// naming the field), and nothing is to be forwarded.
func CreateShape(req *runtimeapi.CreateContainerRequest) error {
	switch {
	case req.GetConfig() == nil:
		return fmt.Errorf("config: required: %w", errdefs.ErrInvalidArgument)
	case req.GetConfig().GetImage() == nil:
		return fmt.Errorf("config.image: required: %w", errdefs.ErrInvalidArgument)
	case req.GetConfig().GetImage().GetImage() == "":
		return fmt.Errorf("config.image.image: required: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// ContainerImages returns every image a container would see: its own
// image and the image of each image volume mount (KEP-4639; containerd
// 2.1+ mounts config.mounts[].image read-only). A mount whose image spec
// names nothing is left to the runtime, which refuses it.
func ContainerImages(cfg *runtimeapi.ContainerConfig) []ImageUse {
	uses := []ImageUse{{Image: QueryOf(cfg.GetImage()), Field: "image"}}
	for i, m := range cfg.GetMounts() {
		if m.GetImage().GetImage() != "" {
			uses = append(uses, ImageUse{Image: QueryOf(m.GetImage()), Field: fmt.Sprintf("mounts[%d].image", i)})
		}
	}
	return uses
}
