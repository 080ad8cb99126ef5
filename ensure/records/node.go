package records

import (
	"slices"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Image is an image present on the node as the records see it: its ID,
// the repositories the runtime lists it under, and the names (tags and
// digests) it lists it under.
type Image struct {
	ID           string
	Repositories []string
	Names        []string
}

// NodeImage is the image id the runtime lists under names (its tags and
// digests), with their repositories, each once. A name that does not
// parse, or is an ID, names no repository.
func NodeImage(id string, names []string) Image {
	img := Image{ID: id, Names: names}
	for _, n := range names {
		if repo, ok := imageref.Repository(n); ok && !slices.Contains(img.Repositories, repo) {
			img.Repositories = append(img.Repositories, repo)
		}
	}
	return img
}
