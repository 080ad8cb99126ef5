package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestEnsurePreloadedStaysPreloaded: an image on the node before the proxy
// pulled it (preloaded around the proxy: a pull straight at containerd)
// stays free to every pod by the names it had, after tenant A pulls the
// same digest through the proxy with its credentials under another name:
// in the same repository (the tag A pulled stays A's) and in another one;
// by name and by a CreateContainer that names the image by its ID alone
// (kubelets before 1.28; CRI-O fails such a create by itself, as it
// does straight to it: the proxy passing it on is what is shown there);
// across a restart of the proxy
// (https://github.com/kubernetes/kubernetes/issues/138175). The other order, A's private pull first
// and the same digest appearing later under another name, gives that name
// nothing in A's repository, nor the image by ID.
func TestEnsurePreloadedStaysPreloaded(t *testing.T) {
	needRig(t)
	p := startEnsureProxy(t, "ensure-preloaded")
	alice := newTenant(t, "preloaded-a", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "preloaded-b", "")
	reg := testRig.Registry + "/"
	// Each case is a digest of its own: busybox with the case's marker,
	// pushed under every name the case uses.
	push := func(t *testing.T, marker string, refs ...string) {
		t.Helper()
		for _, ref := range refs {
			if _, err := testRig.PushBusybox(ref, marker); err != nil {
				t.Fatal(err)
			}
			crictl(t, direct(), "rmi", reg+ref)
			t.Cleanup(func() { crictl(t, direct(), "rmi", reg+ref) })
		}
	}
	// preload puts the image on the node around the proxy.
	preload := func(t *testing.T, ref string) {
		t.Helper()
		mustCrictl(t, direct(), "pull", "--creds", alice.creds, reg+ref)
	}
	imageID := func(t *testing.T, ref string) string {
		t.Helper()
		return strings.TrimSpace(mustCrictl(t, direct(), "inspecti", "-o", "go-template", "--template", "{{.status.id}}", reg+ref))
	}
	sandbox := strings.TrimSpace(mustCrictl(t, p.ep, "runp", bob.config))
	t.Cleanup(func() { crictl(t, direct(), "stopp", sandbox); crictl(t, direct(), "rmp", sandbox) })
	n := 0
	// bCreates is B's CreateContainer of image (the image ID, as the
	// kubelet sends it) with user (the pod's image, "" for a kubelet
	// before 1.28): nil when allowed (the container is removed again).
	bCreates := func(t *testing.T, id, user string) error {
		t.Helper()
		n++
		img := map[string]any{"image": id}
		if user != "" {
			img["user_specified_image"] = user
		}
		cfg := writeJSON(t, fmt.Sprintf("preloaded-%d-ctr.json", n), map[string]any{
			"metadata": map[string]any{"name": fmt.Sprintf("b-%d", n)}, "image": img,
			"command": []string{"true"}, "log_path": fmt.Sprintf("b-%d.log", n), "linux": map[string]any{},
		})
		ctr, passed, msg := createThrough(t, p.ep, sandbox, cfg, bob.config)
		if !passed {
			if !strings.Contains(msg, "PermissionDenied") {
				t.Fatalf("B's create of %s (%q) failed otherwise than refused: %s", id, user, msg)
			}
			return errors.New(msg)
		}
		if ctr != "" {
			crictl(t, p.ep, "rm", ctr)
		}
		return nil
	}
	// bSees reports whether ImageStatus through the proxy shows B the
	// image: what decides the kubelet's Never and IfNotPresent.
	bSees := func(t *testing.T, ref string) bool {
		t.Helper()
		return crictl(t, p.ep, "inspecti", reg+ref).Err == nil
	}
	// free checks that B may use ref by name and by its ID alone.
	free := func(t *testing.T, ref, when string) {
		t.Helper()
		id := imageID(t, ref)
		if !bSees(t, ref) {
			t.Errorf("%s: %s is hidden from B", when, ref)
		}
		if err := bCreates(t, id, reg+ref); err != nil {
			t.Errorf("%s: B's create of %s was refused: %v", when, ref, err)
		}
		if err := bCreates(t, id, ""); err != nil {
			t.Errorf("%s: B's create of %s by its ID alone was refused: %v", when, ref, err)
		}
	}
	// aliceOnly checks that ref is A's: hidden from B, B's create refused.
	aliceOnly := func(t *testing.T, ref, when string) {
		t.Helper()
		if bSees(t, ref) {
			t.Errorf("%s: %s, A's, is shown to B", when, ref)
		}
		if err := bCreates(t, imageID(t, ref), reg+ref); err == nil {
			t.Errorf("%s: B's create of %s, A's, was allowed", when, ref)
		}
	}
	aPulls := func(t *testing.T, ref string) {
		t.Helper()
		if r := alice.pull(t, p.ep, reg+ref); r.Err != nil {
			t.Fatalf("A's pull of %s: %v\n%s", ref, r.Err, r.Stderr)
		}
	}
	restart := func(t *testing.T) {
		t.Helper()
		p.proc.Stop(10 * time.Second)
		p.start(t)
	}

	t.Run("preloaded first, then A's pull of another tag of its repository", func(t *testing.T) {
		node, v1 := "preloaded-same/base:node", "preloaded-same/base:v1"
		push(t, "preloaded same repository", node, v1)
		preload(t, node)
		free(t, node, "before A's pull")
		aPulls(t, v1)
		free(t, node, "after A's pull")
		aliceOnly(t, v1, "after A's pull")
		restart(t)
		free(t, node, "after a restart")
		aliceOnly(t, v1, "after a restart")
		if out, err := p.records(t, "explain", reg+node); err != nil || !strings.Contains(out, "preloaded") || !strings.Contains(out, "any pod may use it") {
			t.Errorf("explain: %v\n%s", err, out)
		}
	})

	t.Run("preloaded first, then A's pull of the same digest from another repository", func(t *testing.T) {
		node, private := "preloaded-other/base:node", "preloaded-other-private/app:v1"
		push(t, "preloaded another repository", node, private)
		preload(t, node)
		free(t, node, "before A's pull")
		aPulls(t, private)
		free(t, node, "after A's pull")
		aliceOnly(t, private, "after A's pull")
		restart(t)
		free(t, node, "after a restart")
	})

	t.Run("A's pull first, then the same digest preloaded under other names", func(t *testing.T) {
		v1, node, other := "preloaded-later/app:v1", "preloaded-later/app:node", "preloaded-later-other/base:node"
		push(t, "preloaded after a private pull", v1, node, other)
		aPulls(t, v1)
		preload(t, node)
		preload(t, other)
		// The image came through the proxy first: a tag added to A's
		// repository around the proxy is no evidence it was ever free.
		aliceOnly(t, node, "a tag of A's repository added after A's pull")
		// Another repository is decided per repository, as before: free by
		// its name; by ID the image is still A's.
		if !bSees(t, other) {
			t.Errorf("%s, another repository, is hidden from B", other)
		}
		if err := bCreates(t, imageID(t, other), reg+other); err != nil {
			t.Errorf("B's create of %s, another repository, was refused: %v", other, err)
		}
		if err := bCreates(t, imageID(t, other), ""); err == nil {
			t.Errorf("B's create by ID alone of an image that came through the proxy first was allowed")
		}
	})
}
