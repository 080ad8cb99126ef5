// Package rig starts real components for the end-to-end and node tests
// (e2e), the bench and the demo (hack/demo): a private containerd (own
// root, state and socket; CRI plugin) or, with RUNTIME=crio, a private
// CRI-O (crio.go says what differs), the Debian distribution registry on
// 127.0.0.1 twice over one storage (one with htpasswd/bcrypt
// authentication, one anonymous), test images built and pushed in Go with
// credentials, crictl/critest, and the proxy binary.
//
// The registry's requests can be read back: RegistryRequests (its access
// log: method, path, status, 401s included) and, with
// Options.RegistryUsers, RegistryUsers (the user each authenticated
// request was answered for).
//
// A DelayRelay, named to containerd with AddMirror, puts the registry a
// network hop away (the bench) or makes its pulls slow enough to cut.
//
// Everything listens on 127.0.0.1 or on unix sockets under the rig's
// directory (CRI-O's pods: on a bridge of the rig's own). Nothing reaches
// the internet: the runtime mirrors gcr.io and registry.k8s.io to the
// local registries.
//
// The packages and tools must be installed first (hack/install-deps.sh);
// Start checks and says what is missing. A rig needs root.
package rig
