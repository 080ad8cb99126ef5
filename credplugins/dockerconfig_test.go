package credplugins

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/keyring"
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

// docker-config-credential-provider's answer, cached by the injector as the
// kubelet caches it: pulled first, an image of another team must not leave
// a registry-wide answer that hides team-a's own key from team-a's images.
func TestARegistryWideAnswerNeverHidesANarrowerKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`{"auths": {
		"registry.test": {"username": "everyone", "password": "e-pw"},
		"registry.test/team-a": {"username": "team-a", "password": "a-pw"}
	}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := keyring.ReadDockerConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	in := newTestInjector(t, testclock.NewFakeClock(t0), prov("docker-config", time.Hour, dockerConfigRunner{d}, "registry.test"))
	ctx := context.Background()
	if c, _, _ := in.Lookup(ctx, "registry.test/team-b/app", nil); len(c) != 1 || c[0].Credential.Username != "everyone" {
		t.Fatalf("team-b's image: %+v", c)
	}
	c, answers, _ := in.Lookup(ctx, "registry.test/team-a/app", nil)
	if len(c) == 0 || c[0].Credential.Username != "team-a" || answers[0].FromCache {
		t.Errorf("team-a's image after team-b's: first candidate %+v (from the cache: %v), want team-a's own key", c, len(answers) > 0 && answers[0].FromCache)
	}
}
