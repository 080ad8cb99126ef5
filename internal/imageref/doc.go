// Package imageref is the one place that says what an image string given
// to the CRI is: an image ID, a possible ID prefix, or a reference, and
// for a reference its normalized repository (what records, policies and
// credential providers key on) and its full normalized form (the default
// tag added). An image ID is never a reference: "sha256:<64 hex>" would
// otherwise parse as the repository docker.io/library/sha256 with a tag.
// Names remembers parses, for the hot paths that see the same few names on
// every kubelet sync. Parsing is github.com/distribution/reference's.
package imageref
