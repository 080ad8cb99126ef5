package keyring

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dockerConfig builds a docker config.json whose entries are key ->
// username (the password is the username's, with "-pw").
func dockerConfig(t *testing.T, users map[string]string) *DockerConfig {
	t.Helper()
	auths := map[string]any{}
	for k, u := range users {
		auths[k] = map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(u + ":" + u + "-pw"))}
	}
	b, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDockerConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func usernames(cs []Credential) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Username)
	}
	return out
}

// The kubelet's keyring serves Docker Hub images from the key docker login
// and kubectl create secret docker-registry write for Docker Hub when no
// other key matches them (pkg/credentialprovider/keyring.go,
// isDefaultRegistryMatch and defaultRegistryHost). Credentials is the pull
// secrets' path (ensure links a pod's secret to its pull with it); Lookup
// the docker config file's (bake --docker-config,
// docker-config-credential-provider).
func TestDockerHubKeysServeDockerHubImages(t *testing.T) {
	t.Parallel()
	login := map[string]string{"https://index.docker.io/v1/": "hub"}
	for _, tc := range []struct {
		name  string
		keys  map[string]string
		image string
		want  []string
	}{
		{"docker login's key serves an official image, normalised", login, "docker.io/library/nginx", []string{"hub"}},
		{"docker login's key serves an organisation's image, normalised", login, "docker.io/org/app", []string{"hub"}},
		{"docker login's key serves a name without registry", login, "nginx", []string{"hub"}},
		{"docker login's key serves an organisation's name without registry", login, "org/app", []string{"hub"}},
		{"docker login's key serves an index.docker.io name", login, "index.docker.io/library/nginx", []string{"hub"}},
		{"docker login's key serves no other registry", login, "registry.test/library/nginx", nil},
		{"docker login's key serves no registry with a port", login, "registry:5000/nginx", nil},
		{"the key without scheme serves Docker Hub images", map[string]string{"index.docker.io": "hub"}, "docker.io/library/nginx", []string{"hub"}},
		{"the key with a /v2/ path serves Docker Hub images", map[string]string{"https://index.docker.io/v2/": "hub"}, "docker.io/org/app", []string{"hub"}},
		{"the key over http serves Docker Hub images", map[string]string{"http://index.docker.io/v1/": "hub"}, "docker.io/org/app", []string{"hub"}},
		{"a docker.io key matches Docker Hub images itself", map[string]string{"docker.io": "io"}, "docker.io/org/app", []string{"io"}},
		{"a key that matches the image turns the fallback off, as in the kubelet",
			map[string]string{"https://index.docker.io/v1/": "hub", "docker.io/org": "org"}, "docker.io/org/app", []string{"org"}},
		{"the fallback still serves the images no key matches",
			map[string]string{"https://index.docker.io/v1/": "hub", "docker.io/org": "org"}, "docker.io/library/nginx", []string{"hub"}},
		{"an index.docker.io key with a path serves no normalised image, as in the kubelet",
			map[string]string{"index.docker.io/org": "org"}, "docker.io/org/app", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := dockerConfig(t, tc.keys)
			if diff := cmp.Diff(tc.want, usernames(d.Credentials(tc.image))); diff != "" {
				t.Errorf("Credentials (pull secrets) (-want +got):\n%s", diff)
			}
			auth, _ := d.Lookup(tc.image)
			var got []string
			for _, c := range auth {
				got = append(got, c.Username)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Lookup (docker config file) (-want +got):\n%s", diff)
			}
		})
	}
}

func TestADockerConfigWithDockerHubsKeyRunsForDockerHubImages(t *testing.T) {
	t.Parallel()
	d := dockerConfig(t, map[string]string{"https://index.docker.io/v1/": "hub", "registry.test/team": "team"})
	want := []string{"docker.io", "index.docker.io", "registry.test/team"}
	if diff := cmp.Diff(want, d.MatchImages()); diff != "" {
		t.Errorf("MatchImages (-want +got):\n%s", diff)
	}
	for _, image := range []string{"docker.io/library/nginx", "docker.io/org/app"} {
		matched := false
		for _, p := range d.MatchImages() {
			matched = matched || MatchImage(p, image)
		}
		if !matched {
			t.Errorf("no pattern matches %s: a provider answering from the file would not run for it", image)
		}
	}
}

func TestIsDefaultRegistryImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		image string
		want  bool
	}{
		{"docker.io/library/nginx", true},
		{"docker.io/org/app", true},
		{"index.docker.io/library/nginx", true},
		{"nginx", true},
		{"org/app", true},
		{"localhost/app", true}, // no '.' or ':': the kubelet's rule counts it as Docker Hub's
		{"registry.test/app", false},
		{"registry:5000/app", false},
		{"127.0.0.1:5000/app", false},
		{"", false},
		{"/app", false},
	} {
		t.Run(fmt.Sprintf("%q", tc.image), func(t *testing.T) {
			if got := IsDefaultRegistryImage(tc.image); got != tc.want {
				t.Errorf("IsDefaultRegistryImage(%q) = %v, want %v", tc.image, got, tc.want)
			}
		})
	}
}
