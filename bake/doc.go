// Package bake pulls a node image's images into the container runtime at
// build time, with the credentials the node will use (credential provider
// plugins, or a docker config.json), and tells the node that boots from
// the image that they are preloaded.
//
// Contract:
//   - Images are pulled straight into the runtime's image service (no
//     proxy in between), at most Options.Parallel at a time; the
//     credentials are tried as the proxy's own injection tries them
//     (credplugins.Injector): same order, same errors, never a secret in
//     them.
//   - Every listed image gets a Result, in list order; a failed image does
//     not stop the others.
//   - Pulling again is harmless: the runtime fetches only what changed, and
//     writing the same preload record twice changes nothing.
//   - RecordPreloaded writes, per pulled image, a record that makes its
//     repository accessible to every pod of the node (as an anonymous pull
//     would), so the ensure logic hands it out under every policy, and
//     keeps the names it was baked under as its preloaded names (free by
//     them and by its ID after another tenant's pull of the same digest);
//     Allowlist gives the repositories for
//     preloadedImagesVerificationAllowlist instead.
package bake
