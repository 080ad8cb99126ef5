package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// ImagePolicy decides whether a pod's namespace may use an image (#23);
// *imagepolicy.Engine is the real one. It is asked at each try of a pull,
// on the manifest digest the image's registry resolved, before the
// runtime pulls, and for each image a container would see.
type ImagePolicy interface {
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

// policyGate is image policy on the CRI path, shared by the Guard and, with
// ensure off, by PolicyHooks. A nil *policyGate is no image policy: it
// allows everything and asks nothing.
type policyGate struct {
	policy ImagePolicy
	log    *slog.Logger
	// names parses image names, remembered (the Decider's, for the Guard).
	names *imageref.Names
	// pods, when the proxy has the API, names a pod's service account.
	pods cachedPods
}

// cachedPods finds a pod in memory (an informer's cache), never asking the
// API: the plugins are told the service account when it is at hand, and a
// cached verdict costs no API round trip. *podtoken.Source is the real one.
type cachedPods interface {
	CachedPod(namespace, name, uid string) *corev1.Pod
}

// nodePlatform is the platform the runtime pulls and runs: the registry
// check picks an index's manifest for it (containerd's default), and the
// plugins are told.
var nodePlatform = func() *imagepolicy.Platform {
	p := platforms.DefaultSpec()
	return &imagepolicy.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}()

func newPolicyGate(policy ImagePolicy, pods cachedPods, names *imageref.Names, log *slog.Logger) *policyGate {
	if policy == nil {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &policyGate{policy: policy, log: log, names: names, pods: pods}
}

// policyPod is the pod as the plugins see it. The service account is not
// in the CRI: it comes from the informer's copy of the pod, when the proxy
// has the API and the pod is there. It is for the plugin's information
// (and its log): verdicts are cached and merged per namespace, not per
// pod or account.
func (p *policyGate) policyPod(pod crireq.Pod) imagepolicy.Pod {
	out := imagepolicy.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Static: pod.Static}
	if p.pods != nil && pod.UID != "" {
		if kpod := p.pods.CachedPod(pod.Namespace, pod.Name, pod.UID); kpod != nil {
			out.ServiceAccount = kpod.Spec.ServiceAccountName
		}
	}
	return out
}

// repository is the normalized repository image names, "" for an image ID
// or a name the runtime may take for a prefix of one: what it stands for
// cannot be told from the name.
func (p *policyGate) repository(image string) string {
	if imageref.MayBeIDPrefix(image) {
		return ""
	}
	return p.names.Parse(image).Repository
}

// pull decides one try of a pull on what the image's registry answered
// for it: the manifest digest the pull is pinned to (the runtime's image
// must then be the config the registry answered, or the pull is refused).
// imageID is the image already on the node the name stands for, if the
// registry's answer is that image. A refusal is the error the client
// sees: PermissionDenied with the pod's reason; the operator's reason is
// in the engine's log.
func (p *policyGate) pull(ctx context.Context, image string, pod crireq.Pod, cred registry.Credential, res registry.Result, imageID string) (imagepolicy.Verdict, error) {
	if p == nil {
		return imagepolicy.Verdict{Allowed: true}, nil
	}
	s := imagepolicy.Subject{
		Call: imagepolicy.CallPullImage, Image: image, Repository: p.repository(image), Digest: res.ManifestDigest.String(),
		ImageID: imageID, Platform: nodePlatform, Pod: p.policyPod(pod), Credential: policyCredential(cred),
	}
	v, _ := p.policy.Decide(ctx, s) // a verdict with an error refuses
	if !v.Allowed {
		return v, fmt.Errorf("pulling %s: %w", image, v.Err())
	}
	return v, nil
}

// nameDecides reports whether a pull of image for pod is decided on the
// name alone: a policy is configured, the name names a repository, and no
// provider applies to it in the pod's namespace (its no-match policy
// decides, with no question to the registry).
func (p *policyGate) nameDecides(pod crireq.Pod, image string) bool {
	if p == nil {
		return false
	}
	repo := p.repository(image)
	return repo != "" && !p.policy.Applies(pod.Namespace, repo)
}

// bind carries an allowed pull's verdict over to the image ID it produced.
func (p *policyGate) bind(v imagepolicy.Verdict, imageID string) {
	if p != nil {
		p.policy.Bind(v, imageID)
	}
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

// admit decides one image use of a container for pod: the image (img, as
// the runtime resolved it, known as repo; resolveErr the runtime's error)
// must be allowed for the pod's namespace. Fail closed: when the runtime
// cannot say which image a name stands for, or the name is no image of the
// node (a checkpoint archive), the use is refused if a policy may apply.
func (p *policyGate) admit(ctx context.Context, pod crireq.Pod, use crireq.ImageUse, img crireq.Image, repo string, resolveErr error) error {
	if p == nil {
		return nil
	}
	shown := use.Shown()
	switch {
	case resolveErr != nil && !crireq.RuntimeAnswered(resolveErr, use.Image.Name):
		if !p.policy.Applies(pod.Namespace, p.repositoryOfUse(use)) {
			return p.uncovered(ctx, pod, use)
		}
		p.log.WarnContext(ctx, "image policy: the runtime cannot answer which image a container uses; refused until it can",
			"image", shown, "field", use.Field, "pod", pod.String(), "err", resolveErr)
		return fmt.Errorf("image %q for pod %s: %w: the image policy check could not be made; retry", shown, pod, errdefs.ErrUnavailable)
	case img.ID == "":
		// An image volume the runtime does not have is refused by the
		// runtime itself. A container's image that is no image of the node
		// may be a checkpoint archive, whose base image cannot be seen.
		if use.Field != "image" {
			return nil
		}
		if !p.policy.Applies(pod.Namespace, p.repositoryOfUse(use)) {
			return p.uncovered(ctx, pod, use)
		}
		p.log.InfoContext(ctx, "image policy: container refused: not an image of the node, its image policy cannot be checked",
			"image", shown, "field", use.Field, "pod", pod.String())
		return fmt.Errorf("image %q for pod %s: %w: not an image of the node; its image policy cannot be checked", shown, pod, imagepolicy.ErrDenied)
	}
	call := imagepolicy.CallCreateContainer
	if use.Field != "image" {
		call = imagepolicy.CallImageVolume
	}
	s := imagepolicy.Subject{Call: call, Image: shown, ImageID: img.ID, Platform: nodePlatform, Pod: p.policyPod(pod)}
	return p.eachRepository(img, repo, func(repo, digest string) error {
		s.Repository, s.Digest = repo, digest
		v, _ := p.policy.Decide(ctx, s) // a verdict with an error refuses
		if v.Allowed {
			return nil
		}
		// The pod's owner reads the image as the pod named it and the
		// policy's short reason; the engine logged the operator's.
		return fmt.Errorf("image %q for pod %s: %w", shown, pod, v.Err())
	})
}

// uncovered decides an image use no provider applies to, by what its name
// says (the runtime could not tell which image it is, or holds none): the
// namespace's no-match policy allows it, warns, or refuses it.
func (p *policyGate) uncovered(ctx context.Context, pod crireq.Pod, use crireq.ImageUse) error {
	call := imagepolicy.CallCreateContainer
	if use.Field != "image" {
		call = imagepolicy.CallImageVolume
	}
	s := imagepolicy.Subject{Call: call, Image: use.Shown(), Repository: p.repositoryOfUse(use), Platform: nodePlatform, Pod: p.policyPod(pod)}
	v, _ := p.policy.Decide(ctx, s) // a verdict with an error refuses
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
func (p *policyGate) eachRepository(img crireq.Image, repo string, f func(repo, digest string) error) error {
	if repo != "" {
		return f(repo, p.repoDigest(img.Names, repo))
	}
	decided := false
	for i, name := range img.Names {
		r, _ := p.repoAndDigest(name)
		if r == "" || p.listedBefore(img.Names[:i], r) {
			continue
		}
		decided = true
		if err := f(r, p.repoDigest(img.Names, r)); err != nil {
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
func (p *policyGate) repositoryOfUse(use crireq.ImageUse) string {
	for _, name := range []string{use.Image.UserSpecified, use.Image.Name} {
		if r := p.repository(name); r != "" {
			return r
		}
	}
	return ""
}

// repoDigest is the manifest digest the runtime recorded for repo: a name
// repo@sha256:... among names; "" when it has none (an imported image).
func (p *policyGate) repoDigest(names []string, repo string) string {
	if repo == "" {
		return ""
	}
	for _, name := range names {
		if r, d := p.repoAndDigest(name); d != "" && r == repo {
			return d
		}
	}
	return ""
}

// repoAndDigest splits a name the runtime lists an image under (a
// normalized reference, never an ID): its repository, and its digest when
// it is a repo digest.
func (p *policyGate) repoAndDigest(name string) (repo, digest string) {
	at := strings.LastIndexByte(name, '@')
	if at < 0 {
		return p.names.Parse(name).Repository, ""
	}
	return p.names.Parse(name[:at]).Repository, name[at+1:]
}

// listedBefore reports whether repo is the repository of one of names.
func (p *policyGate) listedBefore(names []string, repo string) bool {
	for _, n := range names {
		if r, _ := p.repoAndDigest(n); r == repo {
			return true
		}
	}
	return false
}

// PolicyExplainer says what an image policy would decide, running no
// plugin; *imagepolicy.Engine is one.
type PolicyExplainer interface {
	Explain(s imagepolicy.Subject) imagepolicy.Explanation
}

// PolicyExplanation is what the image policy would decide for an image
// used by a container of a namespace, for each repository it is decided
// as (records explain --namespace).
type PolicyExplanation struct {
	Image    string            `json:"image"`
	ImageRef string            `json:"imageRef,omitempty"`
	Present  bool              `json:"present"`
	As       []PolicyDecidedAs `json:"as"`
}

// PolicyDecidedAs is the image decided as one repository.
type PolicyDecidedAs struct {
	Repository  string                  `json:"repository,omitempty"`
	Digest      string                  `json:"digest,omitempty"`
	Explanation imagepolicy.Explanation `json:"explanation"`
}

// ErrNoImagePolicy: the daemon runs no image policy.
var ErrNoImagePolicy = errors.New("the daemon runs no image policy (no imagePolicy section)")

// ExplainPolicy tells what the image policy would decide for a container
// of namespace using image (a name, an image ID or a prefix of one), as
// the runtime resolves it, and what each provider has cached; it runs no
// plugin and changes nothing.
func (g *Guard) ExplainPolicy(ctx context.Context, image, namespace string) (*PolicyExplanation, error) {
	if g.imagePolicy == nil {
		return nil, ErrNoImagePolicy
	}
	ex, ok := g.imagePolicy.policy.(PolicyExplainer)
	if !ok {
		return nil, ErrNoImagePolicy
	}
	x := &PolicyExplanation{Image: image}
	img, repo, err := g.resolve(ctx, crireq.ImageQuery{Name: image})
	if err != nil && !crireq.RuntimeAnswered(err, image) {
		return nil, fmt.Errorf("asking the runtime about %s: %w", image, err)
	}
	x.ImageRef, x.Present = img.ID, img.ID != ""
	if !x.Present {
		// As a pull would name it: by its repository, with no digest yet.
		img, repo = crireq.Image{}, g.imagePolicy.repository(image)
	}
	s := imagepolicy.Subject{Call: imagepolicy.CallCreateContainer, Image: image, ImageID: img.ID, Platform: nodePlatform, Pod: imagepolicy.Pod{Namespace: namespace}}
	_ = g.imagePolicy.eachRepository(img, repo, func(repo, digest string) error {
		s.Repository, s.Digest = repo, digest
		x.As = append(x.As, PolicyDecidedAs{Repository: repo, Digest: digest, Explanation: ex.Explain(s)})
		return nil
	})
	return x, nil
}
