// Package runtimecontent reads a manifest from containerd's content store
// (its content API, on the socket that serves CRI, in the k8s.io
// namespace the CRI plugin pulls into) while the runtime's pull is still
// under way: the registry check learns the image's config digest from it
// and asks the registry for the config beside the rest of the pull.
//
// Only content containerd fetched and verified against its digest is in
// its store, and the caller verifies the bytes against the digest the
// registry named again: the store is a source of bytes, never of trust.
// A runtime without the content API (CRI-O) answers Unimplemented once;
// the Reader then answers ErrUnsupported without asking again.
package runtimecontent
