// Package kubeletrecords reads and writes the kubelet's own on-disk records
// of KEP-2535 (pkg/kubelet/images/pullmanager, fs_pullrecords.go), so that
// a node can move between the kubelet's enforcement and the proxy's without
// every image becoming "preloaded" or every pod pulling again.
//
// The layout is the kubelet's: DIR/pulled holds one ImagePulledRecord per
// image, DIR/pulling one ImagePullIntent per pull in flight, and
// DIR/observed-preloaded one ImagePreloadedRecord per image that was
// preloaded (its layout and JSON as the upstream change
// https://github.com/kubernetes/kubernetes/pull/139156 has them), each in a file
// named sha256-<hex sha256 of its key> (the image ID for a record, the
// image string for an intent), mode 0600 in directories of mode 0700,
// strict JSON of kubelet.config.k8s.io/v1beta1. Read also takes v1alpha1
// files (the same fields; the kubelet migrates them at start), skips what
// the kubelet skips (*.tmp, names not starting sha256-), and refuses a file
// whose key does not hash to its name, naming the file.
//
// What crosses, and what cannot:
//   - service accounts and "accessible to every pod of the node" are
//     coordinates and flags, the same in both: they cross both ways;
//   - a pull secret's credential hash does not: the kubelet's is an
//     unsalted SHA-256 of the credential, the proxy's a salted one, and
//     neither can be computed from the other. Read drops the kubelet's
//     secret entries (their pods verify again: nothing is imported as
//     trusted that was verified under another scheme) and counts them.
//     Write carries a secret known by its coordinates (namespace, name,
//     UID) with an empty hash: the kubelet matches such an entry by its
//     coordinates, as the proxy does (the rule for rotated secrets), and
//     writes its own hash at the first match. A secret the proxy knows
//     only by its hash (a pull without the API) is not written, and
//     counted.
//   - preloaded names do not cross whole: the kubelet keys them by
//     repository, the proxy by full name (a tag of a repository can be
//     preloaded while another tag of it is a tenant's). Write writes the
//     repositories of an image's preloaded names, less those the image was
//     also pulled as (the kubelet forgets a repository at its first pull;
//     their names then need verification under the kubelet). Import gives
//     an image, for each observed repository it was not pulled as, the
//     names the runtime lists it under in that repository, and leaves out
//     images with no record (preloaded by every name anyway); when the
//     runtime cannot be asked, the names stay out (they need
//     verification), the records still come in.
//
// A record left with no credential still crosses: it says the image was
// pulled with credentials, so that it is never taken for a preloaded one.
// The kubelet verifies every use of an image it has a record of; the proxy
// decides per repository. A record that names no repository at all (the
// kubelet's settled pull intents: no credentialMapping, or an empty one)
// is therefore imported with every repository the runtime lists its image
// under, each with no credential; when there are such records and the
// runtime cannot be asked, Import imports nothing.
package kubeletrecords
