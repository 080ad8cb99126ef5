// Command image builds the OCI image of cri-image-proxy without a docker
// daemon: the static binaries of `make release` on an empty base, with the
// host's CA bundle (for credential plugins that call a cloud API), a
// passwd file and /tmp, one manifest per platform under an OCI index. It
// writes an OCI image layout and, with -push, pushes the index to a
// registry with the credentials of the docker config ($DOCKER_CONFIG).
//
// Layers and configs are deterministic: fixed owners and times (the
// commit's time with -created), sorted entries, so that the same binaries
// give the same digests.
package main
