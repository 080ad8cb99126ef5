package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestEachPodPullsWithTheCredentialOfItsOwnToken: two pods of one service
// account pull one private image through the proxy at once. The token
// plugin answers per token (pod pa's token gets alice's credential, pb's
// bob's) and cacheDuration 0, KEP-4412's way to keep credentials from being
// shared across pods. The registry's log shows each pod's pull
// authenticated with the credential minted for its own token: the plugin
// ran once per token, as the kubelet merges runs per token, never once for
// both with the first pod's token.
func TestEachPodPullsWithTheCredentialOfItsOwnToken(t *testing.T) {
	k := needKube(t)
	img := testRig.Registry + "/" + rig.TeamAImage
	repo, tag, _ := strings.Cut(rig.TeamAImage, ":")
	manifest := "/v2/" + repo + "/manifests/" + tag
	crictl(t, direct(), "rmi", img)
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })

	const ns = "per-token"
	createNamespace(t, k, ns)
	createServiceAccount(t, k, ns, "builder", "alice")
	pa := createPod(t, k, ns, "pa", "builder", corev1.PullIfNotPresent, img)
	pb := createPod(t, k, ns, "pb", "builder", corev1.PullIfNotPresent, img)

	s := tokenPluginSetup(t, "--user-for-pod", "pa=alice", "--user-for-pod", "pb=bob", "--cache-duration", "0s")
	// The wrapper widens the window in which concurrent runs are merged:
	// each run waits 2 s before the plugin answers.
	breakPlugin(t, s, "token-provider", fmt.Sprintf("echo run >> %s\nsleep 2\nexec %s \"$@\"\n", s.countFile("token-provider"), tokenBin))
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	ep, proxy := startInjectingProxy(t, s, "pertoken", "--kubeconfig", kubeconfig, "--node-name", nodeName)

	// manifestUsers returns the users the registry answered the image's
	// manifest for (200) after the mark, sorted, and the new mark.
	manifestUsers := func(t *testing.T, mark int) ([]string, int) {
		t.Helper()
		reqs, err := testRig.RegistryUsers()
		if err != nil {
			t.Fatal(err)
		}
		var users []string
		for _, r := range reqs[min(mark, len(reqs)):] {
			if r.Path == manifest && r.Status == 200 && !slices.Contains(users, r.User) {
				users = append(users, r.User)
			}
		}
		slices.Sort(users)
		return users, len(reqs)
	}
	pull := func(tn apiTenant) rig.Result {
		return crictl(t, ep, "pull", "--pod-config", tn.config, img)
	}

	t.Run("two pods of one service account pulling at once each pull with their own token's credential", func(t *testing.T) {
		_, mark := manifestUsers(t, 0)
		runs := s.runs("token-provider")
		results := make([]rig.Result, 2)
		var wg sync.WaitGroup
		for i, tn := range []apiTenant{pa, pb} {
			wg.Add(1)
			go func() { defer wg.Done(); results[i] = pull(tn) }()
		}
		wg.Wait()
		for i, r := range results {
			if r.Err != nil {
				t.Fatalf("pod %d: %v\n%s\nproxy log:\n%s", i, r.Err, r.Stderr, tail(proxy.LogText(), 20))
			}
		}
		if users, _ := manifestUsers(t, mark); !slices.Equal(users, []string{"alice", "bob"}) {
			t.Errorf("the registry answered the manifest for %v, want [alice bob]: one pod got the credential minted for the other's token", users)
		}
		if n := s.runs("token-provider") - runs; n != 2 {
			t.Errorf("the plugin ran %d times for two pods' tokens, want 2", n)
		}
	})

	t.Run("control: each pod pulling alone pulls with its own token's credential", func(t *testing.T) {
		crictl(t, direct(), "rmi", img)
		_, mark := manifestUsers(t, 0)
		for _, c := range []struct {
			tn   apiTenant
			want string
		}{{pa, "alice"}, {pb, "bob"}} {
			if r := pull(c.tn); r.Err != nil {
				t.Fatalf("%s: %v\n%s", c.tn.name, r.Err, r.Stderr)
			}
			var users []string
			if users, mark = manifestUsers(t, mark); !slices.Equal(users, []string{c.want}) {
				t.Errorf("%s's pull: the registry answered the manifest for %v, want [%s]", c.tn.name, users, c.want)
			}
		}
	})
}
