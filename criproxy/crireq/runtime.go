package crireq

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Image is an image of the node.
type Image struct {
	ID    string
	Names []string // the references it is listed under: tags and digests
}

// ImageOf is a CRI image as an Image.
//
// The ID is in its canonical form (imageref.CanonicalID), whichever form
// the runtime writes it in: CRI-O's bare hex and containerd's
// "sha256:<hex>" are the same image.
func ImageOf(img *runtimeapi.Image) Image {
	names := make([]string, 0, len(img.GetRepoTags())+len(img.GetRepoDigests()))
	names = append(names, img.GetRepoTags()...)
	names = append(names, img.GetRepoDigests()...)
	return Image{ID: imageref.CanonicalID(img.GetId()), Names: names}
}

// IDForm is the form a runtime writes image IDs in, learnt from its
// answers: "sha256:<hex>" (containerd, and until a runtime answers
// otherwise) or bare hex (CRI-O). The proxy keeps IDs in the canonical
// form; what it sends the runtime, or answers in its place, is in the
// runtime's own. It is safe for concurrent use.
type IDForm struct{ known, bare atomic.Bool }

// Learn notes the form of an ID the runtime answered.
func (f *IDForm) Learn(id string) {
	if f == nil || !imageref.IsID(id) {
		return
	}
	if bare := !strings.HasPrefix(id, "sha256:"); bare != f.bare.Load() {
		f.bare.Store(bare)
	}
	f.known.Store(true)
}

// Out is id (any form) as the runtime writes it; anything but a full ID
// (a name, a prefix), and anything before the runtime answered an ID, is
// returned as it is.
func (f *IDForm) Out(id string) string {
	if f == nil || !f.known.Load() || !imageref.IsID(id) {
		return id
	}
	if f.bare.Load() {
		return imageref.BareID(id)
	}
	return imageref.CanonicalID(id)
}

// Forms is the forms to ask the runtime for id in: id as the runtime
// writes it, once it has answered an ID; before that, for a full ID, the
// canonical form and then the bare hex (a one-shot command's first
// question: containerd resolves the first, CRI-O the second).
func (f *IDForm) Forms(id string) []string {
	if f == nil || f.known.Load() || !imageref.IsID(id) {
		return []string{f.Out(id)}
	}
	return []string{imageref.CanonicalID(id), imageref.BareID(id)}
}

// Images answers which image of the node a query names, as the runtime
// resolves it. RuntimeImages is the runtime's.
type Images interface {
	// Image returns the image q names (by name, image ID or ID prefix); ok
	// is false when the runtime has no such image. An error is the
	// runtime's, unchanged (its gRPC code tells an answer about the name
	// from no answer at all: RuntimeAnswered).
	Image(ctx context.Context, q ImageQuery) (img Image, ok bool, err error)
}

// ImageStatusClient is the part of the runtime's ImageService that
// answers for one image; the generated client satisfies it.
type ImageStatusClient interface {
	ImageStatus(ctx context.Context, in *runtimeapi.ImageStatusRequest, opts ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error)
}

// RuntimeImages is the Images of a runtime: its ImageStatus, asked
// directly (around the proxy's interceptors).
func RuntimeImages(c ImageStatusClient) Images { return RuntimeImagesIn(c, &IDForm{}) }

// RuntimeImagesIn is RuntimeImages, learning the runtime's ID form in
// form and asking by ID in it.
func RuntimeImagesIn(c ImageStatusClient, form *IDForm) Images { return runtimeImages{c, form} }

type runtimeImages struct {
	c    ImageStatusClient
	form *IDForm
}

// ImageStatusIn asks c for the image q names, a full ID in the runtime's
// form (both forms, one after the other, before the runtime has answered
// one: IDForm.Forms); the answer is the runtime's, unchanged.
func ImageStatusIn(ctx context.Context, c ImageStatusClient, form *IDForm, q ImageQuery, verbose bool) (*runtimeapi.ImageStatusResponse, error) {
	var resp *runtimeapi.ImageStatusResponse
	var err error
	for _, name := range form.Forms(q.Name) {
		q.Name = name
		if resp, err = c.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: q.spec(), Verbose: verbose}); err == nil && resp.GetImage() != nil {
			break
		}
	}
	return resp, err
}

// LearnID notes the form of an ID the runtime answered elsewhere.
func (r runtimeImages) LearnID(id string) { r.form.Learn(id) }

func (r runtimeImages) Image(ctx context.Context, q ImageQuery) (Image, bool, error) {
	resp, err := ImageStatusIn(ctx, r.c, r.form, q, false)
	if err != nil || resp.GetImage() == nil {
		return Image{}, false, err
	}
	r.form.Learn(resp.Image.GetId())
	return ImageOf(resp.Image), true, nil
}

// Resolve returns the image q names, as the runtime answers (a zero Image
// when absent), and the repository it is known under: the repository of
// the name the pod gave or the name asked, when the image is listed under
// it; "" when it cannot be told (a lookup by ID, or a name the image is
// not listed under). names parses, remembered.
func Resolve(ctx context.Context, images Images, names *imageref.Names, q ImageQuery) (Image, string, error) {
	img, ok, err := images.Image(ctx, q)
	if err != nil || !ok {
		return Image{}, "", err
	}
	for _, name := range []string{q.UserSpecified, q.Name} {
		if n := names.Parse(name); n.OK && ListedAs(names, n.Repository, img.Names) {
			return img, n.Repository, nil
		}
	}
	return img, "", nil
}

// ListedAs reports whether one of the references of lists (the names the
// runtime lists an image under) is of repository repo.
func ListedAs(names *imageref.Names, repo string, lists ...[]string) bool {
	for _, list := range lists {
		for _, r := range list {
			if n := names.Parse(r); n.OK && n.Repository == repo {
				return true
			}
		}
	}
	return false
}

// ImageID returns the image ID a pull's image_ref stands for: the ref
// itself when it is an ID (containerd), else what the runtime answers for
// the name pulled (a runtime that answers a repo digest). When it cannot
// be told, the ref is kept: what is keyed on it can only be missed, never
// match another image.
func ImageID(ctx context.Context, images Images, name, ref string) string {
	if imageref.IsID(ref) {
		return imageref.CanonicalID(ref)
	}
	if img, ok, err := images.Image(ctx, ImageQuery{Name: name}); err == nil && ok && img.ID != "" {
		return img.ID
	}
	return ref
}

// LearnPullRef notes the form of a pull's image_ref, as the runtime
// answered it (a PullImage response): it may be the first ID the runtime
// gave, and the next question by ID must be in its form. Only the
// runtime's own answers teach: an ID the proxy passes on (its canonical
// form) would teach a bare-hex runtime the wrong one.
func LearnPullRef(images Images, ref string) {
	if l, ok := images.(idLearner); ok && imageref.IsID(ref) {
		l.LearnID(ref)
	}
}

// idLearner is an Images that learns the runtime's form of image IDs
// from its answers (IDForm).
type idLearner interface{ LearnID(id string) }

// IDDigest is an image ID as a digest (a bare hex ID is sha256's).
func IDDigest(id string) digest.Digest {
	if d, err := digest.Parse(id); err == nil {
		return d
	}
	return digest.Digest("sha256:" + id)
}

// PulledAsAnswered is nil when the image ID the runtime's pull of image
// produced is the image the registry answered for that pull (its config
// digest), else the pull's Aborted error: a tag moved while it was pulled,
// or the runtime got the image elsewhere, and the registry vouched for
// another image than the one the node now holds. The caller logs its own
// consequence.
func PulledAsAnswered(image, pulledID string, answered digest.Digest) error {
	if imageref.IsID(pulledID) && IDDigest(pulledID) == answered {
		return nil
	}
	return fmt.Errorf("pulling %s: the image changed while it was pulled; retry: %w", image, errdefs.ErrAborted)
}

// RuntimeAnswered reports whether an ImageStatus error for name is the
// runtime's answer about the name (it cannot be parsed, or is not found),
// as opposed to the runtime not answering at all (down, restarting,
// overloaded). A name that can name no image is answered whatever the
// code: containerd 1.6 says Unknown for a name that is no reference and
// no ID prefix, and no runtime could resolve it to an image.
func RuntimeAnswered(err error, name string) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound:
		return true
	}
	return imageref.NamesNoImage(name)
}
