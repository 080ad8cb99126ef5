package keyring

import (
	"testing"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
)

// Lookup's cache key type is what docker-config-credential-provider (and
// bake's in-process provider) answer: a Registry answer serves every later
// image of the registry without a run, so it may be given only where every
// image of the registry gets the same answer from the file.
func TestLookupAnswersRegistryOnlyWhenNoKeyIsNarrowerThanTheRegistry(t *testing.T) {
	t.Parallel()
	const (
		image    = credentialproviderapi.ImagePluginCacheKeyType
		registry = credentialproviderapi.RegistryPluginCacheKeyType
	)
	for _, tc := range []struct {
		name  string
		keys  map[string]string
		image string
		want  credentialproviderapi.PluginCacheKeyType
	}{
		{"registry keys only: Registry", map[string]string{"registry.test": "a", "*.test": "g"}, "registry.test/team-b/app", registry},
		{"a narrower key for another path of the registry: Image",
			map[string]string{"registry.test": "a", "registry.test/team-a": "t"}, "registry.test/team-b/app", image},
		{"the image of the narrower key: Image",
			map[string]string{"registry.test": "a", "registry.test/team-a": "t"}, "registry.test/team-a/app", image},
		{"an image no key serves, on a registry with a narrower key: Image (an empty Registry answer hides the key too)",
			map[string]string{"registry.test/team-a": "t"}, "registry.test/team-b/app", image},
		{"a glob key with a path on a host that matches the registry: Image",
			map[string]string{"registry.test": "a", "*.test/team-a": "t"}, "registry.test/team-b/app", image},
		{"a narrower key on another registry: Registry",
			map[string]string{"registry.test": "a", "other.test/team-a": "t"}, "registry.test/team-b/app", registry},
		{"a narrower key on another port of the host: Registry",
			map[string]string{"registry.test": "a", "registry.test:5000/team-a": "t"}, "registry.test/team-b/app", registry},
		{"a /v1/ path is the registry, not narrower: Registry",
			map[string]string{"https://registry.test/v1/": "a"}, "registry.test/team-b/app", registry},
		{"Docker Hub's key alone: Registry", map[string]string{"https://index.docker.io/v1/": "hub"}, "docker.io/library/nginx", registry},
		{"Docker Hub's key with a docker.io organisation's key: Image",
			map[string]string{"https://index.docker.io/v1/": "hub", "docker.io/org": "org"}, "docker.io/library/nginx", image},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, got := dockerConfig(t, tc.keys).Lookup(tc.image); got != tc.want {
				t.Errorf("Lookup(%q) key type %s, want %s", tc.image, got, tc.want)
			}
		})
	}
}
