package ensure

import (
	"context"
	"errors"
	"fmt"
	"iter"

	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// ImagePolicy is image policy on the guard's path: it decides each try of
// a pull on the manifest digest the image's registry names (Verify), and
// each image a container would see on the runtime's answer ensure already
// has (Admit), after ensure's own decision. *cri.Gate (package
// imagepolicy/cri) is the real one.
type ImagePolicy interface {
	// Pull decides one try of a pull of image for pod with cred, on the
	// manifest digest the registry names for it ("" when the name alone
	// decides: NameDecides); imageID is the image already on the node the
	// name stands for, if that manifest is its. A refusal is the error the
	// client sees; allowed, bind binds the verdict to the image the pull
	// produced.
	Pull(ctx context.Context, image string, pod crireq.Pod, cred registry.Credential, manifest digest.Digest, imageID string) (bind func(imageID string), err error)
	// NameDecides reports whether a pull of image for pod is decided on
	// the name alone, before the registry is asked: no provider applies,
	// and the namespace's no-match policy decides.
	NameDecides(pod crireq.Pod, image string) bool
	// Admit decides one image use of a container for pod, on the runtime's
	// answer: img, known as repo, or resolveErr.
	Admit(ctx context.Context, pod crireq.Pod, use crireq.ImageUse, img crireq.Image, repo string, resolveErr error) error
	// Explain says, running no plugin, what would be decided for a
	// container of namespace using image, held as img (known as repo; the
	// zero Image when absent): each subject it is decided as, with its
	// explanation; false when the policy cannot explain.
	Explain(image, namespace string, img crireq.Image, repo string) (iter.Seq2[imagepolicy.Subject, imagepolicy.Explanation], bool)
}

// noImagePolicy is the guard's image policy when none is configured: it
// allows everything and asks nothing.
type noImagePolicy struct{}

func (noImagePolicy) Pull(context.Context, string, crireq.Pod, registry.Credential, digest.Digest, string) (func(string), error) {
	return func(string) {}, nil
}
func (noImagePolicy) NameDecides(crireq.Pod, string) bool { return false }
func (noImagePolicy) Admit(context.Context, crireq.Pod, crireq.ImageUse, crireq.Image, string, error) error {
	return nil
}
func (noImagePolicy) Explain(string, string, crireq.Image, string) (iter.Seq2[imagepolicy.Subject, imagepolicy.Explanation], bool) {
	return nil, false
}

// ErrNoImagePolicy: the daemon runs no image policy.
var ErrNoImagePolicy = errors.New("the daemon runs no image policy (no imagePolicy section)")

// ExplainPolicy tells what the image policy would decide for a container
// of namespace using image (a name, an image ID or a prefix of one), as
// the runtime resolves it, and what each provider has cached; it runs no
// plugin and changes nothing.
func (g *Guard) ExplainPolicy(ctx context.Context, image, namespace string) (*PolicyExplanation, error) {
	if _, none := g.imagePolicy.(noImagePolicy); none {
		return nil, ErrNoImagePolicy
	}
	img, repo, err := g.resolve(ctx, crireq.ImageQuery{Name: image})
	if err != nil && !crireq.RuntimeAnswered(err, image) {
		return nil, fmt.Errorf("asking the runtime about %s: %w", image, err)
	}
	decided, ok := g.imagePolicy.Explain(image, namespace, img, repo)
	if !ok {
		return nil, ErrNoImagePolicy
	}
	x := &PolicyExplanation{Image: image, ImageRef: img.ID, Present: img.ID != ""}
	for s, ex := range decided {
		x.As = append(x.As, PolicyDecidedAs{Repository: s.Repository, Digest: s.Digest, Explanation: ex})
	}
	return x, nil
}
