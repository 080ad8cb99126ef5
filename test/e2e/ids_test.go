package e2e

import (
	"strings"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Image IDs come in the runtime's form: containerd writes "sha256:<hex>",
// CRI-O bare hex (the same digest), and the proxy answers in the
// runtime's. A test sends an ID back in the form it was given (CRI-O
// resolves no "sha256:<hex>"), and compares IDs with sameImage.

// sameImage reports whether a and b are one image's ID, whichever form
// each is in.
func sameImage(a, b string) bool {
	return imageref.IsID(a) && imageref.CanonicalID(a) == imageref.CanonicalID(b)
}

// pulledImageID is the image ID crictl pull printed ("Image is up to date
// for <ID>"), in either form; false when it printed none.
func pulledImageID(out string) (string, bool) {
	id, ok := strings.CutPrefix(strings.TrimSpace(out), "Image is up to date for ")
	return id, ok && imageref.IsID(id)
}

// runtimeForm is an image ID as the rig's runtime writes it (CRI-O: bare
// hex), to name the image by in a call straight to the runtime.
func runtimeForm(id string) string {
	if testRig.Runtime.CRIO() && imageref.IsID(id) {
		return imageref.BareID(id)
	}
	return id
}
