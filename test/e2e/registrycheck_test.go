package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// TestTheRegistrysWordNotTheRuntimes: a runtime's pull that succeeded
// is no proof that a credential can read an image. Two setups common on
// real nodes make it succeed without the registry's word, shown first
// straight to the runtime (the controls), then refused through the proxy:
//   - a mirror (containerd's hosts.toml, CRI-O's registries.conf) that
//     serves the private registry's content to anyone (a second registry
//     over the same storage, without authentication, as a pull-through
//     cache holding the registry's credentials does);
//   - a registry of B's own that serves A's manifest under B's name and no
//     blob at all: containerd fetches nothing, the content being on the
//     node already, and B's name comes to stand for A's image. CRI-O
//     fetches the config whatever it holds and fails the pull by itself;
//     through the proxy B is refused all the same.
//
// A keeps working and re-uses; a legitimate copy of the image in B's own
// repository (B pushed the blobs) still works for B.
func TestTheRegistrysWordNotTheRuntimes(t *testing.T) {
	needRig(t)
	// A private image of A's, under a name of the registry the test puts
	// a mirror in front of.
	regName := privateRegistryName()
	if _, err := testRig.PushBusybox("mirror-a/app:v1", "a's private image, behind a mirror"); err != nil {
		t.Fatal(err)
	}
	imgA := regName + "/mirror-a/app:v1"
	alice := newTenant(t, "rc-alice", "alice:"+rig.Users["alice"])
	alice2 := newTenant(t, "rc-alice2", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "rc-bob", "")
	bobWrong := newTenant(t, "rc-bob-wrong", "bob:wrong-password")
	bobOwn := newTenant(t, "rc-bob-own", "bob:"+rig.Users["bob"])
	carol := newTenant(t, "rc-carol", "")
	rmi := func(images ...string) {
		for _, i := range images {
			crictl(t, direct(), "rmi", i)
		}
	}
	t.Cleanup(func() { rmi(imgA) })

	regPort := portOf(t, testRig.Registry)
	restoreHosts := mirrorForAnyone(t, regName)
	t.Run("control: straight to the runtime, the mirror serves A's private image with no credential", func(t *testing.T) {
		rmi(imgA)
		if r := crictl(t, direct(), "pull", imgA); r.Err != nil {
			t.Fatalf("the mirror did not serve it: the test's premise is wrong: %v\n%s", r.Err, r.Stderr)
		}
		rmi(imgA)
	})

	p := startEnsureProxy(t, "registry-check")
	var idA string
	t.Run("A pulls with its credential, verified at the registry itself", func(t *testing.T) {
		if r := alice.pull(t, p.ep, imgA); r.Err != nil {
			t.Fatalf("%v\n%s", r.Err, r.Stderr)
		}
		idA = imageID(t, imgA)
		if log := p.proc.LogText(); !strings.Contains(log, "the registry verified the credential") || !strings.Contains(log, fmt.Sprintf("endpoint=http://127.0.0.1:%d/", regPort)) {
			t.Errorf("the decision log does not say the registry (127.0.0.1:%d) verified A's credential", regPort)
		}
		if out, err := p.records(t, "explain", imgA); err != nil || !strings.Contains(out, "verified:") || !strings.Contains(out, fmt.Sprintf("by the registry (http://127.0.0.1:%d/", regPort)) || !strings.Contains(out, "basic credential") {
			t.Errorf("records explain does not say which endpoint verified A's credential, and how: %v\n%s", err, out)
		}
	})
	for _, b := range []tenant{bob, bobWrong} {
		t.Run("B ("+b.name+") is refused although the mirror would serve it, and the image stays hidden", func(t *testing.T) {
			if r := crictl(t, p.ep, "inspecti", imgA); r.Err == nil {
				t.Errorf("ImageStatus showed B the image")
			}
			r := b.pull(t, p.ep, imgA)
			if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") || !strings.Contains(r.Stderr, imgA) || strings.Contains(r.Stderr, idA) {
				t.Errorf("want a refusal naming the image and not its ID: %v\n%s", r.Err, r.Stderr)
			}
			// The runtime pulls beside the check (through the mirror, here),
			// and the check's refusal stops it: whatever it did, the image is
			// hidden from B still.
			if r := crictl(t, p.ep, "inspecti", imgA); r.Err == nil {
				t.Errorf("ImageStatus shows B the image after its refused pull")
			}
		})
	}
	t.Run("C, who pulled nothing, cannot create a container from A's image by name or by ID", func(t *testing.T) {
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", carol.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		for _, ref := range []string{imgA, idA} {
			r := crictl(t, p.ep, "create", podID, containerConfig(t, "c-ctr", ref, "true"), carol.config)
			if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") {
				t.Errorf("C's container of %s: %v\n%s", ref, r.Err, r.Stderr)
			}
		}
	})
	t.Run("A's second pod re-uses the image with no registry request", func(t *testing.T) {
		if n := len(requestsDuring(t, testRig.Registry, func() {
			if r := alice2.pull(t, p.ep, imgA); r.Err != nil {
				t.Fatalf("%v\n%s", r.Err, r.Stderr)
			}
		})); n != 0 {
			t.Errorf("%d registry requests, want a re-use from the node", n)
		}
	})
	restoreHosts()

	// B's own registry: it answers A's manifest for b/app:v1, and no blob.
	manifest, mediaType := rawManifest(t, testRig.Registry+"/mirror-a/app:v1")
	bReg := startManifestOnlyRegistry(t, "b/app", "v1", manifest, mediaType)
	if err := testRig.AddMirror(bReg, portOf(t, bReg)); err != nil {
		t.Fatal(err)
	}
	imgB := bReg + "/b/app:v1"
	t.Run("control: straight to the runtime, B's manifest-only copy pulls and names A's image (containerd), or fails (CRI-O)", func(t *testing.T) {
		r := crictl(t, direct(), "pull", imgB)
		if testRig.Runtime.CRIO() {
			// CRI-O fetches an image's config from the registry whatever the
			// node holds: B's registry serves none, so B's name comes to
			// stand for nothing. The proxy's refusal below holds all the same.
			if r.Err == nil {
				t.Fatalf("%s pulled B's manifest-only copy, whose registry serves no blob: %s", testRig.Runtime.Name, r.Stdout)
			}
			if id, held := runtimeImage(t, imgB); held {
				t.Fatalf("%s failed B's pull but holds B's name, as %s", testRig.Runtime.Name, id)
			}
			t.Logf("%s refuses B's manifest-only copy by itself: %s", testRig.Runtime.Name, crictlMessage(r.Stderr))
			return
		}
		if r.Err != nil {
			t.Fatalf("the pull of B's name failed: the test's premise is wrong: %v\n%s", r.Err, r.Stderr)
		}
		if got := imageID(t, imgB); got != idA {
			t.Fatalf("B's name stands for %s, not A's image %s: the test's premise is wrong", got, idA)
		}
		// containerd removes an image with all its names: A's goes too, and
		// A pulls it again through the proxy.
		rmi(imgB)
		if r := alice.pull(t, p.ep, imgA); r.Err != nil {
			t.Fatalf("A's pull again: %v\n%s", r.Err, r.Stderr)
		}
	})
	t.Run("through the proxy B's manifest-only pull is refused, B's name is hidden if the runtime holds it, and B's container of it is refused", func(t *testing.T) {
		// The refusal is the proxy's (the config is no content B serves) or,
		// when the runtime's pull ended first, the runtime's own: either way
		// B reads nothing B's own registry did not serve it.
		if r := bob.pull(t, p.ep, imgB); r.Err == nil || !strings.Contains(r.Stderr, imgB) {
			t.Errorf("want a refusal naming B's image: %v\n%s", r.Err, r.Stderr)
		}
		if _, held := runtimeImage(t, imgB); held {
			if r := crictl(t, p.ep, "inspecti", imgB); r.Err == nil {
				t.Errorf("the runtime holds B's name and the proxy shows it")
			}
		}
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", bob.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		if r := crictl(t, p.ep, "create", podID, containerConfig(t, "b-ctr", imgB, "true"), bob.config); r.Err == nil {
			t.Errorf("B created a container of %s", imgB)
		}
	})
	t.Run("a legitimate copy in B's own repository, blobs pushed, works for B", func(t *testing.T) {
		copyImage(t, testRig.Registry+"/mirror-a/app:v1", testRig.Registry+"/team-b-copy/app:v1")
		imgCopy := regName + "/team-b-copy/app:v1"
		t.Cleanup(func() { rmi(imgCopy) })
		if r := bobOwn.pull(t, p.ep, imgCopy); r.Err != nil {
			t.Fatalf("B's pull of its own copy: %v\n%s", r.Err, r.Stderr)
		}
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", bobOwn.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		if r := crictl(t, p.ep, "create", podID, containerConfig(t, "b-own-ctr", imgCopy, "true"), bobOwn.config); r.Err != nil {
			t.Errorf("B's container of its own copy: %v\n%s", r.Err, r.Stderr)
		}
	})
}

// rigRegistryName is the rig's authenticated registry under a DNS-like
// name, with a hosts.toml of its own that tests may rewrite.
const rigRegistryName = "registry.rig.test"

// privateRegistryName is the name under which a test pulls the rig's
// authenticated registry with credentials while it may put a mirror in
// front of it (mirrorForAnyone): rigRegistryName on containerd, which
// sends a pull's credential wherever it pulls the name from. CRI-O sends
// it only to the host an image's name names, never to a mirror or to the
// location registries.conf rewrites a name to: there the registry is
// named by its address.
func privateRegistryName() string {
	if testRig.Runtime.CRIO() {
		return testRig.Registry
	}
	return rigRegistryName
}

// mirrorForAnyone puts a mirror that serves anyone in front of the
// registry name (rigRegistryName, or the authenticated registry's
// address): the rig's anonymous registry (the same storage), tried
// first, as the runtime tries a mirror before the registry; as a
// pull-through cache holding the registry's credentials, or a peer
// mirror, serves the registry's content. The proxy's registry check still
// asks the registry (rig.SetMirror). The returned func takes the mirror
// away, as the test's end does.
func mirrorForAnyone(t *testing.T, name string) (restore func()) {
	t.Helper()
	regPort := portOf(t, testRig.Registry)
	restore = func() {
		if err := testRig.AddMirror(name, regPort); err != nil {
			t.Errorf("taking the mirror of %s away: %v", name, err)
		}
	}
	if err := testRig.SetMirror(name, portOf(t, testRig.AnonRegistry), regPort); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	return restore
}

// portOf is the port of a host:port.
func portOf(t *testing.T, hostport string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// imageID is the runtime's image ID of a name, asked directly.
func imageID(t *testing.T, image string) string {
	t.Helper()
	id, ok := runtimeImage(t, image)
	if !ok {
		t.Fatalf("%s is not on the node", image)
	}
	return id
}

// rawManifest is an image's manifest as its registry serves it.
func rawManifest(t *testing.T, ref string) ([]byte, string) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r, remote.WithAuth(&authn.Basic{Username: "user", Password: rig.Users["user"]}))
	if err != nil {
		t.Fatal(err)
	}
	return desc.Manifest, string(desc.MediaType)
}

// copyImage copies an image, blobs and all, within the authenticated
// registry, as a tenant that can read it pushes it to its own repository.
func copyImage(t *testing.T, from, to string) {
	t.Helper()
	auth := remote.WithAuth(&authn.Basic{Username: "user", Password: rig.Users["user"]})
	src, err := name.ParseReference(from, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.ParseReference(to, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, auth)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, auth); err != nil {
		t.Fatal(err)
	}
}

// startManifestOnlyRegistry is a registry B runs: it answers one manifest
// for repo:tag (HEAD and GET, by tag or by its digest) and 404 for
// everything else, every blob included. On 127.0.0.1.
func startManifestOnlyRegistry(t *testing.T, repo, tag string, manifest []byte, mediaType string) string {
	t.Helper()
	r := testkit.NewRegistry(t)
	r.Manifest(t, repo, tag, mediaType, manifest)
	return r.Host
}
