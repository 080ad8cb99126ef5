package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
)

func init() {
	register(func(g *Guard) criproxy.Interceptor { return criproxy.Intercept(criproxy.PullImage, g.PullImage) })
}

// PullImage answers from the node a pull whose credential is already
// verified (right after a hide), and otherwise forwards it and records the
// credential once the registry accepted it.
func (g *Guard) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	name := req.GetImage().GetImage()
	repo, ok := g.repository(name)
	if !ok {
		return next(ctx, req)
	}
	cred := Credential{Hash: g.store.HashAuth(authOf(req.GetAuth()))}
	pod := req.GetSandboxConfig().GetMetadata()

	if ref, hidden := g.hidden.peek(name, g.clock.Now()); hidden {
		ok, why := g.verified(ref, repo, cred.Hash)
		if !ok && g.pods != nil && pod.GetUid() != "" {
			// As the kubelet's MustAttemptImagePull: the pod may be entitled
			// by another of its pull secrets (rotated included), or by its
			// service account (a token plugin behind the proxy).
			if kpod, err := g.pods.Pod(ctx, pod.GetNamespace(), pod.GetName(), pod.GetUid()); err == nil {
				ok, why = g.entitled(ctx, kpod, ref, repo)
			}
		}
		if ok {
			g.hidden.take(name)
			g.grants.grant(pod.GetUid(), ref, g.clock.Now())
			g.metrics.reuses.Inc()
			g.logDecision(ctx, "PullImage: answered from the node, no registry traffic", name, ref, podName(pod), why)
			return &runtimeapi.PullImageResponse{ImageRef: ref}, nil
		}
		g.logDecision(ctx, "PullImage: not answered from the node, the registry verifies", name, ref, podName(pod), why)
	}

	intent, err := g.store.AddIntent(name)
	if err != nil {
		// As the kubelet: no intent, no pull (a crash could not be told apart
		// from a preloaded image).
		g.metrics.recordErr.Inc()
		g.log.Error("noting a pull intent failed; the pull is refused until the database takes writes again", "image", name, "err", err)
		// The cause (a path, a disk) is the operator's: the pod's owner
		// reads this in an event.
		return nil, fmt.Errorf("ensure: the pull of %s cannot be recorded now: %w; retry later", name, errdefs.ErrUnavailable)
	}
	g.pending.inc(repo)
	defer g.pending.dec(repo)
	ctx, reported := pullreport.With(ctx)
	resp, err := next(ctx, req)
	if err != nil {
		g.metrics.pulls.WithLabelValues("failure").Inc()
		if derr := g.store.DropIntent(intent); derr != nil {
			g.log.Warn("dropping a pull intent failed; it will be dropped at start", "image", name, "err", derr)
		}
		if g.hasLeftover() {
			g.settlePulled(name)
		}
		return nil, err
	}
	g.metrics.pulls.WithLabelValues("success").Inc()
	g.hidden.take(name)
	// The record holds the credential that succeeded: a plugin's, when an
	// inner hook reports one (the request had none, or the registry refused
	// the request's own), else the request's.
	if r, ok := reported(); ok {
		if r.ServiceAccount != nil {
			// A token plugin pulled it with the pod's service account.
			cred = Credential{ServiceAccount: &ServiceAccount{Namespace: r.ServiceAccount.Namespace, Name: r.ServiceAccount.Name, UID: r.ServiceAccount.UID}}
		} else {
			// Node-wide plugin credentials: every pod of the node could pull
			// it the same way.
			cred = Credential{Node: true}
		}
	} else if cred.Hash == "" {
		cred.Node = true // anonymous
	}
	if cred.Hash != "" {
		cred.Secret = g.secretOf(ctx, pod.GetNamespace(), pod.GetName(), pod.GetUid(), repo, cred.Hash)
	}
	ref := g.imageID(ctx, name, resp.GetImageRef())
	unlock := g.refs.lock(ref)
	defer unlock()
	if err := g.store.RecordPull(ref, repo, cred, intent, g.clock.Now()); err != nil {
		// The intent stays on disk: at the next start it becomes a record
		// with no credential. Until then, as the kubelet's intent counter
		// does, the image counts as pulled by the proxy with no verified
		// credential, by its repository and by its ID: never as preloaded.
		g.pending.inc(repo)
		g.unrecorded.inc(ref)
		g.metrics.recordErr.Inc()
		g.log.Error("recording a verified pull failed; the image needs verification by every other pod until a restart settles its intent",
			"image", name, "imageRef", ref, "err", err)
	}
	g.grants.grant(pod.GetUid(), ref, g.clock.Now())
	if g.hasLeftover() {
		g.settlePulled(name)
	}
	g.logDecision(ctx, "PullImage: pulled from the registry, credential recorded", name, ref, podName(pod), describe(cred))
	return resp, nil
}

// imageID returns the image ID a pull's image_ref stands for: the
// ref itself when it is an ID (containerd), else what the runtime answers
// for the name (a runtime that answers a repo digest). When it cannot be
// told, the ref is kept: a record under it can only be missed, never
// match another image.
func (g *Guard) imageID(ctx context.Context, name, ref string) string {
	if imageref.IsID(ref) {
		return ref
	}
	if img, ok, err := g.runtime.Image(ctx, ImageQuery{Name: name}); err == nil && ok && img.ID != "" {
		return img.ID
	}
	return ref
}
