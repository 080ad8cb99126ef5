package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

func init() {
	register(func(g *Guard) criproxy.Interceptor {
		return criproxy.Intercept(criproxy.CreateContainer, g.CreateContainer)
	})
}

// imageUse is one image a container would see, and where the request
// names it.
type imageUse struct {
	spec  *runtimeapi.ImageSpec
	field string // "image", "mounts[2].image": for the operator's log
}

// containerImages returns every image a container would see: its own
// image and the image of each image volume mount (KEP-4639; containerd
// 2.1+ mounts config.mounts[].image read-only). A mount whose image spec
// names nothing is left to the runtime, which refuses it.
func containerImages(cfg *runtimeapi.ContainerConfig) []imageUse {
	uses := []imageUse{{spec: cfg.GetImage(), field: "image"}}
	for i, m := range cfg.GetMounts() {
		if m.GetImage().GetImage() != "" {
			uses = append(uses, imageUse{spec: m.GetImage(), field: fmt.Sprintf("mounts[%d].image", i)})
		}
	}
	return uses
}

// CreateContainer refuses a container when any image it would see (its
// image, the images of its image volumes, by whatever name or ID they are
// given) needs verification and the pod has neither a grant for it nor,
// with the API, an entitlement. Each image gets the same decision.
func (g *Guard) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	pod := req.GetSandboxConfig().GetMetadata()
	for _, use := range containerImages(req.GetConfig()) {
		if err := g.admit(ctx, pod, use); err != nil {
			return nil, err
		}
	}
	return next(ctx, req)
}

// admit decides one image of a container for pod: nil when it may be
// used, an error the client sees otherwise.
func (g *Guard) admit(ctx context.Context, pod *runtimeapi.PodSandboxMetadata, use imageUse) error {
	spec := use.spec
	shown := spec.GetUserSpecifiedImage()
	if shown == "" {
		shown = spec.GetImage()
	}
	ref, repo, err := g.resolve(ctx, queryOf(spec))
	switch {
	case err != nil && !runtimeAnswered(err):
		if !g.mayNeedVerification(spec.GetImage()) {
			return nil
		}
		g.metrics.denials.Inc()
		g.log.Warn("ensure: the runtime cannot answer the image check; the container is refused until it can",
			"image", shown, "field", use.field, "pod", podName(pod), "err", err)
		return fmt.Errorf("image %q for pod %s: %w: the image check could not be made; retry", shown, podName(pod), errdefs.ErrUnavailable)
	case ref != "":
	case use.field == "image" && g.Policy().VerificationRequired("", true):
		// Not an image of the node (absent, or a name the runtime cannot
		// parse), yet containerd may still create from it: a file path,
		// absolute or relative to its working directory, is restored as a
		// checkpoint archive, with a base image named inside it that the
		// proxy cannot see. The kubelet only creates from images it found
		// present, so this refuses nothing it does.
		g.refused(ctx, pod, use, shown, "", "not an image of the node: a checkpoint archive's base image cannot be checked")
		return fmt.Errorf("image %q for pod %s: %w: it must be pulled with credentials the registry accepts", shown, podName(pod), errdefs.ErrPermissionDenied)
	default:
		// An image volume the runtime does not have, or cannot parse: its
		// CreateContainer refuses with its own error.
		return nil
	}
	d := g.countedDecide(ref, repo)
	if !d.verify || g.grants.has(pod.GetUid(), ref) {
		g.logDecision(ctx, "CreateContainer: allowed ("+use.field+")", shown, ref, podName(pod), d.rule)
		return nil
	}
	if g.pods != nil && repo != "" && pod.GetUid() != "" {
		// A pod the image was shown to (it is entitled) starts without a pull.
		if kpod, err := g.pods.Pod(ctx, pod.GetNamespace(), pod.GetName(), pod.GetUid()); err == nil {
			if ok, why := g.entitled(ctx, kpod, ref, repo); ok {
				g.grants.grant(pod.GetUid(), ref, g.clock.Now())
				g.logDecision(ctx, "CreateContainer: allowed ("+use.field+")", shown, ref, podName(pod), why)
				return nil
			}
		}
	}
	g.refused(ctx, pod, use, shown, ref, d.rule)
	return fmt.Errorf("image %q for pod %s: %w: it must be pulled with credentials the registry accepts",
		shown, podName(pod), errdefs.ErrPermissionDenied)
}

// refused counts and logs a refused image use for the operator: the image
// ID and the rule go here, never into the error the pod's owner reads
// (the event and crictl show only the image as the pod named it).
func (g *Guard) refused(ctx context.Context, pod *runtimeapi.PodSandboxMetadata, use imageUse, shown, ref, rule string) {
	g.metrics.denials.Inc()
	g.log.InfoContext(ctx, "ensure: container refused", "image", shown, "field", use.field, "imageRef", ref, "pod", podName(pod), "rule", rule)
}

// runtimeAnswered reports whether an ImageStatus error is the runtime's
// answer about the name (it cannot be parsed, or is not found), as opposed
// to the runtime not answering at all (down, restarting, overloaded).
func runtimeAnswered(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound:
		return true
	}
	return false
}

// mayNeedVerification reports, from memory only, whether an image given
// by name or ID might need verification: false only when the policy or
// the records say it cannot. Used when the runtime cannot tell which image
// a name stands for.
func (g *Guard) mayNeedVerification(image string) bool {
	repo, ok := g.repository(image)
	if !ok || imageref.MayBeIDPrefix(image) {
		// An ID, or a name containerd may resolve as a prefix of one: it can
		// stand for any image the proxy pulled.
		return g.Policy().VerificationRequired("", true)
	}
	return g.repoMayNeedVerification(repo)
}
