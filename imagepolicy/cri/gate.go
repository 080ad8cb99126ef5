package cri

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"

	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// Policy decides whether a pod's namespace may use an image;
// *imagepolicy.Engine is the real one. It is asked at each try of a pull,
// on the manifest digest the image's registry resolved, before the
// runtime pulls, and for each image a container would see.
type Policy interface {
	// Decide is the verdict for a subject; a verdict that comes with an
	// error refuses.
	Decide(ctx context.Context, s imagepolicy.Subject) (imagepolicy.Verdict, error)
	// Bind carries a pull's verdict over to the image ID the pull produced.
	Bind(v imagepolicy.Verdict, imageID string)
	// Applies reports whether some provider applies to images of
	// repository ("" unknown) for namespace ("" the default), running no
	// plugin.
	Applies(namespace, repository string) bool
	// NoMatchPolicy is what namespace ("" the default) does with an image
	// no provider applies to: Allow, Warn (allowed and counted) or Deny.
	// Decide applies it; a caller asks it only to skip work (a registry or
	// runtime question) when nothing can refuse or be counted.
	NoMatchPolicy(namespace string) imagepolicy.NoMatchPolicy
}

// Explainer says what a policy would decide, running no plugin;
// *imagepolicy.Engine is one.
type Explainer interface {
	Explain(s imagepolicy.Subject) imagepolicy.Explanation
}

// Pods finds a pod in memory (an informer's cache), never asking the API:
// the plugins are told the service account when it is at hand, and a
// cached verdict costs no API round trip. *podtoken.Source is the real
// one.
type Pods interface {
	CachedPod(namespace, name, uid string) *corev1.Pod
}

// Gate is image policy's decisions on the CRI path, shared by ensure's
// guard (through its ImagePolicy) and, with ensure off, by Hooks: a pull
// on the digest the registry names, a container's image on the runtime's
// answer, each verdict bound to the image ID it is about.
type Gate struct {
	policy Policy
	// pods, when the proxy has the API, names a pod's service account.
	pods Pods
	log  *slog.Logger
	// names parses image names, remembered.
	names imageref.Names
}

// nodePlatform is the platform the runtime pulls and runs: the registry
// check picks an index's manifest for it (containerd's default), and the
// plugins are told.
var nodePlatform = func() *imagepolicy.Platform {
	p := platforms.DefaultSpec()
	return &imagepolicy.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}()

// NewGate returns the gate of policy (required). pods, nil without the
// Kubernetes API, tells the plugins a pod's service account.
func NewGate(policy Policy, pods Pods, log *slog.Logger) *Gate {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{policy: policy, pods: pods, log: log}
}

// policyPod is the pod as the plugins see it. The service account is not
// in the CRI: it comes from the informer's copy of the pod, when the proxy
// has the API and the pod is there. It is for the plugin's information
// (and its log): verdicts are cached and merged per namespace, not per
// pod or account.
func (g *Gate) policyPod(pod crireq.Pod) imagepolicy.Pod {
	out := imagepolicy.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Static: pod.Static}
	if g.pods != nil && pod.UID != "" {
		if kpod := g.pods.CachedPod(pod.Namespace, pod.Name, pod.UID); kpod != nil {
			out.ServiceAccount = kpod.Spec.ServiceAccountName
		}
	}
	return out
}

// repository is the normalized repository image names, "" for an image ID
// or a name the runtime may take for a prefix of one: what it stands for
// cannot be told from the name.
func (g *Gate) repository(image string) string {
	if imageref.MayBeIDPrefix(image) {
		return ""
	}
	return g.names.Parse(image).Repository
}

// Pull decides one try of a pull on what the image's registry answered
// for it: manifest, the manifest digest the pull is pinned to (the
// runtime's image must then be the config the registry answered, or the
// pull is refused); "" when the name alone decides (NameDecides). imageID
// is the image already on the node the name stands for, if the registry's
// answer is that image. A refusal is the error the client sees:
// PermissionDenied with the pod's reason; the operator's reason is in the
// engine's log. Allowed, it returns what binds the verdict to the image ID
// the pull then produced (bind): the caller need not hold the engine's
// verdict.
func (g *Gate) Pull(ctx context.Context, image string, pod crireq.Pod, cred registry.Credential, manifest digest.Digest, imageID string) (bind func(imageID string), err error) {
	s := imagepolicy.Subject{
		Call: imagepolicy.CallPullImage, Image: image, Repository: g.repository(image), Digest: manifest.String(),
		ImageID: imageID, Platform: nodePlatform, Pod: g.policyPod(pod), Credential: policyCredential(cred),
	}
	v, _ := g.policy.Decide(ctx, s) // a verdict with an error refuses
	if !v.Allowed {
		return nil, fmt.Errorf("pulling %s: %w", image, v.Err())
	}
	return func(imageID string) { g.policy.Bind(v, imageID) }, nil
}

// NameDecides reports whether a pull of image for pod is decided on the
// name alone: the name names a repository, and no provider applies to it
// in the pod's namespace (its no-match policy decides, with no question to
// the registry).
func (g *Gate) NameDecides(pod crireq.Pod, image string) bool {
	repo := g.repository(image)
	return repo != "" && !g.policy.Applies(pod.Namespace, repo)
}

// policyCredential is a pull's credential as a plugin may receive it: a
// username and password only (the engine gives it only to providers
// allowed to receive it).
func policyCredential(c registry.Credential) *imagepolicy.Credential {
	if c.Kind() != registry.KindBasic {
		return nil
	}
	return &imagepolicy.Credential{Username: c.Username, Password: c.Password}
}

// Admit decides one image use of a container for pod: the image (img, as
// the runtime resolved it, known as repo; resolveErr the runtime's error)
// must be allowed for the pod's namespace. Fail closed: when the runtime
// cannot say which image a name stands for, or the name is no image of the
// node (a checkpoint archive), the use is refused if a policy may apply.
func (g *Gate) Admit(ctx context.Context, pod crireq.Pod, use crireq.ImageUse, img crireq.Image, repo string, resolveErr error) error {
	shown := use.Shown()
	switch {
	case resolveErr != nil && !crireq.RuntimeAnswered(resolveErr, use.Image.Name):
		if !g.policy.Applies(pod.Namespace, g.repositoryOfUse(use)) {
			return g.uncovered(ctx, pod, use)
		}
		g.log.WarnContext(ctx, "image policy: the runtime cannot answer which image a container uses; refused until it can",
			"image", shown, "field", use.Field, "pod", pod.String(), "err", resolveErr)
		return fmt.Errorf("image %q for pod %s: %w: the image policy check could not be made; retry", shown, pod, errdefs.ErrUnavailable)
	case img.ID == "":
		// An image volume the runtime does not have is refused by the
		// runtime itself. A container's image that is no image of the node
		// may be a checkpoint archive, whose base image cannot be seen.
		if use.Field != "image" {
			return nil
		}
		if !g.policy.Applies(pod.Namespace, g.repositoryOfUse(use)) {
			return g.uncovered(ctx, pod, use)
		}
		g.log.InfoContext(ctx, "image policy: container refused: not an image of the node, its image policy cannot be checked",
			"image", shown, "field", use.Field, "pod", pod.String())
		return fmt.Errorf("image %q for pod %s: %w: not an image of the node; its image policy cannot be checked", shown, pod, imagepolicy.ErrDenied)
	}
	s := imagepolicy.Subject{Call: callOf(use), Image: shown, ImageID: img.ID, Platform: nodePlatform, Pod: g.policyPod(pod)}
	return g.eachRepository(img, repo, func(repo, digest string) error {
		s.Repository, s.Digest = repo, digest
		v, _ := g.policy.Decide(ctx, s) // a verdict with an error refuses
		if v.Allowed {
			return nil
		}
		// The pod's owner reads the image as the pod named it and the
		// policy's short reason; the engine logged the operator's.
		return fmt.Errorf("image %q for pod %s: %w", shown, pod, v.Err())
	})
}

// callOf is the call an image use is decided as: the container's image,
// or an image volume.
func callOf(use crireq.ImageUse) imagepolicy.Call {
	if use.Field != "image" {
		return imagepolicy.CallImageVolume
	}
	return imagepolicy.CallCreateContainer
}

// uncovered decides an image use no provider applies to, by what its name
// says (the runtime could not tell which image it is, or holds none): the
// namespace's no-match policy allows it, warns, or refuses it.
func (g *Gate) uncovered(ctx context.Context, pod crireq.Pod, use crireq.ImageUse) error {
	s := imagepolicy.Subject{Call: callOf(use), Image: use.Shown(), Repository: g.repositoryOfUse(use), Platform: nodePlatform, Pod: g.policyPod(pod)}
	v, _ := g.policy.Decide(ctx, s) // a verdict with an error refuses
	if v.Allowed {
		return nil
	}
	return fmt.Errorf("image %q for pod %s: %w", use.Shown(), pod, v.Err())
}

// eachRepository calls f for each repository img is decided as, with the
// manifest digest the runtime recorded for it ("" when none), until f
// fails: repo when the image is known under it; else (known by ID, or by a
// name it is not listed under) every repository it is listed under, as it
// is each of those images; listed under none, "" once, and every provider
// of the namespace applies.
func (g *Gate) eachRepository(img crireq.Image, repo string, f func(repo, digest string) error) error {
	if repo != "" {
		return f(repo, g.repoDigest(img.Names, repo))
	}
	decided := false
	for i, name := range img.Names {
		r, _ := g.repoAndDigest(name)
		if r == "" || g.repositoryAmong(img.Names[:i], r) {
			continue
		}
		decided = true
		if err := f(r, g.repoDigest(img.Names, r)); err != nil {
			return err
		}
	}
	if !decided {
		return f("", "")
	}
	return nil
}

// repositoryOfUse is the repository an image use names, "" when its name
// may be an image ID.
func (g *Gate) repositoryOfUse(use crireq.ImageUse) string {
	for _, name := range []string{use.Image.UserSpecified, use.Image.Name} {
		if r := g.repository(name); r != "" {
			return r
		}
	}
	return ""
}

// repoDigest is the manifest digest the runtime recorded for repo: a name
// repo@sha256:... among names; "" when it has none (an imported image).
func (g *Gate) repoDigest(names []string, repo string) string {
	if repo == "" {
		return ""
	}
	for _, name := range names {
		if r, d := g.repoAndDigest(name); d != "" && r == repo {
			return d
		}
	}
	return ""
}

// repoAndDigest splits a name the runtime lists an image under (a
// normalized reference, never an ID): its repository, and its digest when
// it is a repo digest.
func (g *Gate) repoAndDigest(name string) (repo, digest string) {
	n := g.names.Parse(name)
	return n.Repository, n.Digest()
}

// repositoryAmong reports whether repo is the repository of one of names.
func (g *Gate) repositoryAmong(names []string, repo string) bool {
	for _, n := range names {
		if r, _ := g.repoAndDigest(n); r == repo {
			return true
		}
	}
	return false
}

// Explain says what would be decided for a container of namespace using
// image (a name, an image ID or a prefix of one), held by the node as img
// (known as repo; the zero Image when the node does not hold it): each
// subject it is decided as, with the policy's explanation and what each
// provider has cached. It runs no plugin and changes nothing; false when
// the policy cannot explain.
func (g *Gate) Explain(image, namespace string, img crireq.Image, repo string) (iter.Seq2[imagepolicy.Subject, imagepolicy.Explanation], bool) {
	ex, ok := g.policy.(Explainer)
	if !ok {
		return nil, false
	}
	if img.ID == "" {
		// As a pull would name it: by its repository, with no digest yet.
		img, repo = crireq.Image{}, g.repository(image)
	}
	return func(yield func(imagepolicy.Subject, imagepolicy.Explanation) bool) {
		s := imagepolicy.Subject{Call: imagepolicy.CallCreateContainer, Image: image, ImageID: img.ID, Platform: nodePlatform, Pod: imagepolicy.Pod{Namespace: namespace}}
		_ = g.eachRepository(img, repo, func(repo, digest string) error {
			s.Repository, s.Digest = repo, digest
			if !yield(s, ex.Explain(s)) {
				return errStop
			}
			return nil
		})
	}, true
}

// errStop ends eachRepository early: the caller of an iterator stopped.
var errStop = errors.New("stopped")
