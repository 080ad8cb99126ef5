package credplugins

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// bake --docker-config answers from a docker config.json in process: a
// Docker Hub login ("https://index.docker.io/v1/", as docker login writes
// it) serves Docker Hub images, as the kubelet's keyring does.
func TestADockerConfigInjectorServesDockerHubImagesFromDockerLoginsKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`{"auths": {
		"https://index.docker.io/v1/": {"username": "hub", "password": "hub-pw"},
		"registry.test": {"username": "reg", "password": "reg-pw"}
	}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := NewFromDockerConfig(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, image, want string }{
		{"an official image named without registry", "nginx:1.27", "hub:hub-pw"},
		{"an organisation's image named without registry", "org/app", "hub:hub-pw"},
		{"an official image named docker.io/library/x", "docker.io/library/nginx:1.27", "hub:hub-pw"},
		{"an image named index.docker.io/org/x", "index.docker.io/org/app", "hub:hub-pw"},
		{"another registry's image gets its own key", "registry.test/team/app", "reg:reg-pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := &registry{valid: map[string]bool{tc.want: true}}
			if _, err := in.PullImage(context.Background(), pull(tc.image, nil), reg.next); err != nil {
				t.Fatal(err)
			}
			var tries []string
			for _, r := range reg.seen {
				tries = append(tries, r.GetAuth().GetUsername()+":"+r.GetAuth().GetPassword())
			}
			if diff := cmp.Diff([]string{tc.want}, tries); diff != "" {
				t.Errorf("what the runtime was given (-want +got):\n%s", diff)
			}
		})
	}
}
