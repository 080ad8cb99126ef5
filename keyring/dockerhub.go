package keyring

import "strings"

// DockerHubKey is Docker Hub's key as AuthKey normalises it: docker login
// and kubectl create secret docker-registry write Docker Hub credentials
// under "https://index.docker.io/v1/", which is this host. It matches no
// image by the kubelet's rules (docker.io/library/nginx has two host
// labels, not three); the kubelet's keyring serves Docker Hub images from
// it when no other key matches them (defaultRegistryHost), and Serving
// does the same.
const DockerHubKey = "index.docker.io"

// DockerHubPattern is the matchImages pattern of every Docker Hub image as
// the kubelet and the proxy name it, normalised: docker.io/library/nginx,
// docker.io/org/app.
const DockerHubPattern = "docker.io"

// IsDefaultRegistryImage reports whether image is pulled from Docker Hub,
// by the kubelet's rule (isDefaultRegistryMatch): a name whose first part
// is docker.io or index.docker.io, or names no registry ("nginx",
// "org/app": no '.' or ':' before the first '/'). An empty first part is
// not Docker Hub's.
func IsDefaultRegistryImage(image string) bool {
	first, _, found := strings.Cut(image, "/")
	switch {
	case first == "":
		return false
	case !found:
		return true // "nginx"
	case first == "docker.io" || first == DockerHubKey:
		return true
	}
	return !strings.ContainsAny(first, ".:")
}

// Serving returns the entries that serve image, in their order, as the
// kubelet's keyring picks them (BasicDockerKeyring.Lookup): every entry
// whose key matches the image; when none does and image is Docker Hub's,
// the entries keyed DockerHubKey. key gives an entry's key, normalised by
// AuthKey. This is the one place the Docker Hub fallback is decided, for
// docker config files, pull secrets and plugin answers alike.
//
// The kubelet's keyring holds the keys of all its sources at once (all a
// pod's pull secrets, all the plugins' answers): entries should be given
// together where they are in the kubelet, for a key that matches anywhere
// turns the fallback off everywhere.
func Serving[E any](image string, entries []E, key func(E) string) []E {
	var out []E
	for _, e := range entries {
		if MatchImage(key(e), image) {
			out = append(out, e)
		}
	}
	if len(out) > 0 || !IsDefaultRegistryImage(image) {
		return out
	}
	for _, e := range entries {
		if key(e) == DockerHubKey {
			out = append(out, e)
		}
	}
	return out
}
