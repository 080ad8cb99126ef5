package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// mountConfig writes a crictl container config of image that mounts
// mounted read-only at /vol (an image volume, KEP-4639) and prints its
// marker file. userSpecified is the mount's user_specified_image: the
// kubelet sends the pod's reference of the volume there, beside the image
// ID its pull answered, and CRI-O checks its signature policy by it
// (refusing a mount without one); "" for none, as a crafted call may.
func mountConfig(t *testing.T, name, image, mounted, userSpecified string) string {
	t.Helper()
	spec := map[string]any{"image": mounted}
	if userSpecified != "" {
		spec["user_specified_image"] = userSpecified
	}
	return writeJSON(t, name+"-ctr.json", map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": image},
		"command":  []string{"sh", "-c", "cat /vol/marker; sleep 3600"},
		"mounts":   []map[string]any{{"container_path": "/vol", "readonly": true, "image": spec}},
		"log_path": name + ".log",
		"linux":    map[string]any{},
	})
}

// TestImageVolumesOfAHiddenImageAreRefused: tenant A pulls its private
// image with its password; tenant B, with no credentials, asks for a
// container of a public image that mounts A's image, by name, by image ID
// and by a prefix of the ID. Directly, the runtime (containerd 2.x, CRI-O)
// mounts it and B reads A's file (the leak); through the proxy every form
// is refused.
func TestImageVolumesOfAHiddenImageAreRefused(t *testing.T) {
	needRig(t)
	if testRig.Runtime.Legacy() {
		t.Skipf("SKIPPED: %s has no image volumes (containerd 2.1+)", testRig.Runtime.Name)
	}
	p := startEnsureProxy(t, "imagevolume")
	marker := "tenant-a-volume-secret"
	if _, err := testRig.PushBusybox("team-a/volume:v1", marker); err != nil {
		t.Fatal(err)
	}
	private := testRig.Registry + "/team-a/volume:v1"
	public := testRig.AnonRegistry + "/" + rig.BusyboxImage
	alice := newTenant(t, "alice-vol", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "bob-vol", "")
	if r := alice.pull(t, p.ep, private); r.Err != nil {
		t.Fatalf("A's pull: %v\n%s", r.Err, r.Stderr)
	}
	mustCrictl(t, p.ep, "pull", public)
	id := strings.TrimSpace(mustCrictl(t, direct(), "inspecti", "-o", "go-template", "--template", "{{.status.id}}", private))

	bobPod := strings.TrimSpace(mustCrictl(t, p.ep, "runp", bob.config))
	t.Cleanup(func() { crictl(t, direct(), "stopp", bobPod); crictl(t, direct(), "rmp", bobPod) })

	for _, tc := range []struct{ name, ref, user string }{
		{"by name", private, private},
		{"by image ID", id, ""},
		{"by image ID and name, as a kubelet sends it", id, private},
		{"by a prefix of the image ID", strings.TrimPrefix(id, "sha256:")[:12], ""},
	} {
		t.Run("B's container mounting A's image "+tc.name+" is refused", func(t *testing.T) {
			cfg := mountConfig(t, "vol-"+strings.NewReplacer(" ", "-", ",", "").Replace(tc.name), public, tc.ref, tc.user)
			r := crictl(t, p.ep, "create", bobPod, cfg, bob.config)
			if r.Err == nil {
				ctr := strings.TrimSpace(r.Stdout)
				crictl(t, direct(), "rm", "-f", ctr)
				t.Fatalf("created %s", ctr)
			}
			if msg := crictlMessage(r.Stderr); !strings.Contains(msg, "PermissionDenied") {
				t.Errorf("want PermissionDenied, got: %s", msg)
			}
		})
	}

	t.Run("control: directly, the runtime mounts it and B reads A's file", func(t *testing.T) {
		cfg := mountConfig(t, "vol-direct", public, id, private)
		ctr := strings.TrimSpace(mustCrictl(t, direct(), "create", bobPod, cfg, bob.config))
		t.Cleanup(func() { crictl(t, direct(), "rm", "-f", ctr) })
		mustCrictl(t, direct(), "start", ctr)
		waitUntil(t, 30*time.Second, func() error {
			if out := crictl(t, direct(), "logs", ctr); !strings.Contains(out.Stdout, marker) {
				return fmt.Errorf("logs %q", out.Stdout)
			}
			return nil
		})
	})

	t.Run("A's own pod may mount the image it pulled", func(t *testing.T) {
		alicePod := strings.TrimSpace(mustCrictl(t, p.ep, "runp", alice.config))
		t.Cleanup(func() { crictl(t, direct(), "stopp", alicePod); crictl(t, direct(), "rmp", alicePod) })
		ctr := strings.TrimSpace(mustCrictl(t, p.ep, "create", alicePod, mountConfig(t, "vol-a", public, private, private), alice.config))
		mustCrictl(t, p.ep, "start", ctr)
		waitUntil(t, 30*time.Second, func() error {
			if out := crictl(t, p.ep, "logs", ctr); !strings.Contains(out.Stdout, marker) {
				return fmt.Errorf("logs %q", out.Stdout)
			}
			return nil
		})
	})

	t.Run("a mount of an image the runtime cannot resolve gets the runtime's own error", func(t *testing.T) {
		absent := testRig.Registry + "/team-a/absent:v1"
		cfg := mountConfig(t, "vol-absent", public, absent, absent)
		d := crictl(t, direct(), "create", bobPod, cfg, bob.config)
		pr := crictl(t, p.ep, "create", bobPod, cfg, bob.config)
		if d.Err == nil || pr.Err == nil {
			t.Fatalf("created: direct %v, proxied %v", d.Err, pr.Err)
		}
		if dm, pm := fatalMessage(d.Stderr), fatalMessage(pr.Stderr); dm != pm {
			t.Errorf("error differs:\ndirect:  %s\nproxied: %s", dm, pm)
		}
	})
}
