package cri

import (
	"context"
	"log/slog"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// Hooks are image policy's CRI hooks on a proxy that does not enforce
// ensure: the Gate's decisions, with a registry check and runtime
// questions of their own, so that every path by which an image reaches a
// container passes the same decision whether ensure is on or off. A
// namespace no provider applies to costs nothing: its calls are forwarded
// without a question to the registry or the runtime.
type Hooks struct {
	gate     *Gate
	registry Registry
	images   crireq.Images
	log      *slog.Logger
}

// Registry asks an image's registry which digest a name resolves to, for
// a credential; *registry.Checker is the real one.
type Registry interface {
	Check(ctx context.Context, r registry.Request) (registry.Result, error)
}

// NewHooks returns the hooks of policy (required), asking reg for the
// digest a pull resolves to and images which image a container uses.
// pods, nil without the Kubernetes API, tells the plugins a pod's service
// account, as the guard's gate does.
func NewHooks(policy Policy, pods Pods, reg Registry, images crireq.Images, log *slog.Logger) *Hooks {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hooks{gate: NewGate(policy, pods, log), registry: reg, images: images, log: log}
}

// Interceptors are the outer hooks, for criproxy.New: CreateContainer.
func (h *Hooks) Interceptors() []criproxy.Interceptor {
	return []criproxy.Interceptor{criproxy.Intercept(criproxy.CreateContainer, h.CreateContainer)}
}

// InnerInterceptors are the innermost hooks, after credential injection,
// so that each try of a pull is decided with the credential it goes with:
// PullImage.
func (h *Hooks) InnerInterceptors() []criproxy.Interceptor {
	return []criproxy.Interceptor{criproxy.Intercept(criproxy.PullImage, h.PullImage).Innermost()}
}

// PullImage decides a try of a pull before the runtime pulls: the image's
// registry resolves the name (as the node's containerd would, through its
// hosts.toml) and the verdict is on that manifest digest; the runtime's
// image must then be the one the registry answered, else the pull is
// refused (Aborted: the tag moved in between). A registry that cannot be
// asked refuses the pull when a provider applies.
func (h *Hooks) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	image := req.GetImage().GetImage()
	pod := crireq.PodOf(req.GetSandboxConfig())
	repo := h.gate.repository(image)
	if repo == "" {
		// By ID there is nothing to resolve at a registry: the runtime
		// refuses or finds it, and CreateContainer decides.
		return next(ctx, req)
	}
	cred := registry.CredentialOf(req.GetAuth())
	if !h.gate.policy.Applies(pod.Namespace, repo) {
		// No provider applies: the namespace's no-match policy decides on
		// the name alone, with no question to the registry (a registry that
		// cannot be asked refuses nothing it allows).
		if h.gate.policy.NoMatchPolicy(pod.Namespace) != imagepolicy.NoMatchAllow {
			if _, err := h.gate.Pull(ctx, image, pod, cred, "", ""); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
	res, err := h.registry.Check(ctx, registry.Request{Image: image, Credential: cred})
	if err != nil {
		h.log.WarnContext(ctx, "image policy: the image's registry did not resolve the pull; refused", "image", image, "pod", pod.String(), "err", err)
		return nil, registry.Refusal(image, err)
	}
	bind, err := h.gate.Pull(ctx, image, pod, cred, res.ManifestDigest, "")
	if err != nil {
		return nil, err
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	crireq.LearnPullRef(h.images, resp.GetImageRef())
	id := crireq.ImageID(context.WithoutCancel(ctx), h.images, image, resp.GetImageRef())
	if err := crireq.PulledAsAnswered(image, id, res.ConfigDigest); err != nil {
		h.log.WarnContext(ctx, "image policy: the runtime pulled another image than the registry resolved; refused",
			"image", image, "pulled", id, "registry", res.Endpoint, "answered", res.ConfigDigest, "cause", "a tag moved, or the runtime got the image elsewhere")
		return nil, err
	}
	bind(id)
	return resp, nil
}

// CreateContainer decides every image the container would see (its image
// and each image volume, by name, ID or ID prefix) for the pod's namespace.
func (h *Hooks) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	if err := crireq.CreateShape(req); err != nil {
		return nil, err
	}
	pod := crireq.PodOf(req.GetSandboxConfig())
	if !h.gate.policy.Applies(pod.Namespace, "") && h.gate.policy.NoMatchPolicy(pod.Namespace) == imagepolicy.NoMatchAllow {
		return next(ctx, req) // nothing of the namespace can refuse or count: no runtime question
	}
	for _, use := range crireq.ContainerImages(req.GetConfig()) {
		img, repo, err := crireq.Resolve(ctx, h.images, &h.gate.names, use.Image)
		if err := h.gate.Admit(ctx, pod, use, img, repo, err); err != nil {
			return nil, err
		}
	}
	return next(ctx, req)
}
