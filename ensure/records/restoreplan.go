package records

import (
	"context"
	"fmt"
	"slices"
	"strings"

	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// What a restore is given: the images on the node it marks (present) and
// the layers of those the operator names preloaded (RestoreOptions.Preloaded),
// planned from the runtime's list and the operator's names before the
// database is touched.

// ParsePreloadedList reads a list of preloaded images: one a line, a name
// or an image ID; what follows a # is a comment; blank lines are skipped.
func ParsePreloadedList(data []byte) []string {
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		if line, _, _ = strings.Cut(line, "#"); strings.TrimSpace(line) != "" {
			names = append(names, strings.TrimSpace(line))
		}
	}
	return names
}

// WithoutPreloaded is images (the node's, as NodeImage makes them) less
// those named preloaded: an ID (with or without sha256:) takes out the
// whole image, a name the repository it names, matched normalized (and
// the image when none of its repositories is left). A name or ID that
// matches no image is an error: the operator meant something else.
func WithoutPreloaded(images []Image, preloaded []string) ([]Image, error) {
	wholly := map[string]bool{}            // image ID
	byRepo := map[string]map[string]bool{} // image ID -> repository
	for _, p := range preloaded {
		found := false
		for _, img := range images {
			switch {
			case imageref.IsID(p):
				if img.ID == p || img.ID == "sha256:"+p {
					wholly[img.ID], found = true, true
				}
			case listedAs(img, p):
				repo, _ := imageref.Repository(p)
				if byRepo[img.ID] == nil {
					byRepo[img.ID] = map[string]bool{}
				}
				byRepo[img.ID][repo], found = true, true
			}
		}
		if !found {
			return nil, fmt.Errorf("%s: no such image on the node", p)
		}
	}
	var out []Image
	for _, img := range images {
		if wholly[img.ID] {
			continue
		}
		if x := byRepo[img.ID]; x != nil {
			img.Repositories = slices.DeleteFunc(slices.Clone(img.Repositories), func(r string) bool { return x[r] })
			if len(img.Repositories) == 0 {
				continue
			}
		}
		out = append(out, img)
	}
	return out, nil
}

// listedAs reports whether the runtime lists img under name, normalized.
func listedAs(img Image, name string) bool {
	want, ok := imageref.Normalized(name)
	if !ok {
		return false
	}
	return slices.ContainsFunc(img.Names, func(n string) bool {
		have, ok := imageref.Normalized(n)
		return ok && have == want
	})
}

// LayerSource gives the layers (diff_ids) of an image on the node: the
// runtime. ok is false when it cannot say.
type LayerSource interface {
	ImageLayers(ctx context.Context, imageID string) (diffIDs []digest.Digest, ok bool, err error)
}

// PreloadedLayers asks src for the layers of the images of all that
// present leaves out (those named preloaded, wholly), by image ID, for
// RestoreOptions.Preloaded: the proxy then knows them as on the node
// before anything. An image whose layers src does not give is left out:
// the daemon decides it as an image it never saw.
func PreloadedLayers(ctx context.Context, src LayerSource, all, present []Image) (map[string][]digest.Digest, error) {
	kept := map[string]bool{}
	for _, img := range present {
		kept[img.ID] = true
	}
	out := map[string][]digest.Digest{}
	for _, img := range all {
		if kept[img.ID] {
			continue
		}
		diffIDs, ok, err := src.ImageLayers(ctx, img.ID)
		if err != nil {
			return nil, fmt.Errorf("the layers of %s: %w", img.ID, err)
		}
		if ok {
			out[img.ID] = diffIDs
		}
	}
	return out, nil
}
