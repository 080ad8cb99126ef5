package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Admit decides whether pod may create a container that sees uses (its
// image and the images of its image volumes, by whatever name or ID they
// are given): each gets the same decision, and the first refused one is
// the error the client sees.
func (g *Guard) Admit(ctx context.Context, pod crireq.Pod, uses []crireq.ImageUse) error {
	for _, use := range uses {
		if err := g.admitOne(ctx, pod, use); err != nil {
			return err
		}
	}
	return nil
}

// admitOne decides one image of a container for pod: nil when it may be
// used, an error the client sees otherwise. Ensure decides first, then the
// image policy, if any, on the same answer of the runtime.
func (g *Guard) admitOne(ctx context.Context, pod crireq.Pod, use crireq.ImageUse) error {
	img, repo, err := g.resolve(ctx, use.Image)
	if err := g.admitEnsure(ctx, pod, use, img, repo, err); err != nil {
		return err
	}
	return g.imagePolicy.Admit(ctx, pod, use, img, repo, err)
}

// admitEnsure is ensure's decision on one image of a container: img as
// the runtime resolved it (err its error), known as repo.
func (g *Guard) admitEnsure(ctx context.Context, pod crireq.Pod, use crireq.ImageUse, img crireq.Image, repo string, err error) error {
	shown := use.Shown()
	ref := img.ID
	switch {
	case err != nil && !crireq.RuntimeAnswered(err, use.Image.Name):
		if !g.mayNeedVerification(use.Image.Name) {
			return nil
		}
		g.metrics.denials.Inc()
		g.log.Warn("ensure: the runtime cannot answer the image check; the container is refused until it can",
			"image", shown, "field", use.Field, "pod", pod.String(), "err", err)
		return fmt.Errorf("image %q for pod %s: %w: the image check could not be made; retry", shown, pod, errdefs.ErrUnavailable)
	case ref != "":
	case use.Field == "image" && g.Policy().VerificationRequired("", true):
		// Not an image of the node (absent, or a name the runtime cannot
		// parse), yet containerd may still create from it: a file path,
		// absolute or relative to its working directory, is restored as a
		// checkpoint archive, with a base image named inside it that the
		// proxy cannot see. The kubelet only creates from images it found
		// present, so this refuses nothing it does.
		g.refused(ctx, pod, use, "", "not an image of the node: a checkpoint archive's base image cannot be checked")
		return fmt.Errorf("image %q for pod %s: %w: not an image of the node; what it holds cannot be checked", shown, pod, errdefs.ErrPermissionDenied)
	default:
		// An image volume the runtime does not have, or cannot parse: its
		// CreateContainer refuses with its own error.
		return nil
	}
	if arrived, why := g.ledger.arrivedAroundTheProxy(ctx, img); arrived {
		g.refused(ctx, pod, use, ref, why)
		return refusal(shown, pod)
	}
	d := g.countedDecide(ref, repo, g.askedName(use.Image, repo), img.Names)
	if !d.verify || g.grants.has(pod.UID, ref) {
		g.logDecision(ctx, "CreateContainer: allowed ("+use.Field+")", shown, ref, pod.String(), d.rule)
		return nil
	}
	// A pod the image was shown to (it is entitled) starts without a pull.
	if ok, why := g.entitlements.podEntitled(ctx, pod, ref, repo); ok {
		g.grants.grant(pod.UID, ref, g.clock.Now())
		g.logDecision(ctx, "CreateContainer: allowed ("+use.Field+")", shown, ref, pod.String(), why)
		return nil
	}
	g.refused(ctx, pod, use, ref, d.rule)
	return refusal(shown, pod)
}

// refusal is what a refused pod's owner reads (an event, crictl): the
// image as the pod named it, never its ID or the rule. What it says holds
// for every refusal of ensure at create: an image pulled with another
// tenant's credential, one a pull left that the registry did not verify
// (a failed, cut or aborted pull, anonymous or not), a record past its
// age: the pod runs it once its own pull is accepted by the registry,
// anonymous when the image is public.
func refusal(shown string, pod crireq.Pod) error {
	return fmt.Errorf("image %q for pod %s: %w: it runs only after a pull for this pod that the registry accepts", shown, pod, errdefs.ErrPermissionDenied)
}

// refused counts and logs a refused image use for the operator: the image
// ID and the rule go here, never into the error the pod's owner reads.
func (g *Guard) refused(ctx context.Context, pod crireq.Pod, use crireq.ImageUse, ref, rule string) {
	g.metrics.denials.Inc()
	g.log.InfoContext(ctx, "ensure: container refused", "image", use.Shown(), "field", use.Field, "imageRef", ref, "pod", pod.String(), "rule", rule)
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
