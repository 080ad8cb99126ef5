package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestARecordsDatabaseThatFillsUpSaysSoAndRecovers (threat 21 of
// docs/threat-model.md): the records database on a small tmpfs, filled up while private
// pulls run. From the first write that fails the records condition in
// `crictl info` through the proxy is false (RecordsDatabaseNotWritable),
// /readyz fails and cri_image_proxy_ensure_records_writable is 0; no image
// pulled meanwhile is shown to a tenant without credentials or gives it a
// container. Once space is freed, all of it recovers by itself, with no
// pull (the proxy's write probe, or a GC run, every 2 s here: the probe
// alone is TestARecordsDatabaseMendsItselfWithoutAPull); nothing is shown
// to the tenant then either, the next pull succeeds and the puller re-uses.
func TestARecordsDatabaseThatFillsUpSaysSoAndRecovers(t *testing.T) {
	needRig(t)
	const name = "full-db"
	dir := filepath.Join(testRig.Dir, "ensure-"+name) // startEnsureProxy's
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\n"+
		"ensureSecretPulledImages:\n  enabled: true\n  gcInterval: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mon := freeAddr(t)
	p := startEnsureProxy(t, name, "--config", cfg, "--monitoring-address", mon)

	fresh := newFreshImages(t, "full-db/").push
	conn := mustDial(t, p.ep)
	proxyImages := runtimeapi.NewImageServiceClient(conn)
	alice := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}
	alicePod, alice2 := sandboxConfig(t, "full-alice", "full-alice-uid"), sandboxConfig(t, "full-alice2", "full-alice2-uid")
	pull := func(image string, pod *runtimeapi.PodSandboxConfig) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return kubeletPull(ctx, proxyImages, image, alice, pod)
	}
	state := func() (writable, ready bool, c *condition) {
		t.Helper()
		code, _ := httpGet(t, mon, "/readyz")
		_, metrics := httpGet(t, mon, "/metrics")
		return strings.Contains(metrics, "\ncri_image_proxy_ensure_records_writable 1"), code == 200, recordsCondition(t, p.ep)
	}

	// Two records before the disk fills (as node scenario 15): then bbolt
	// has room for some writes and not for others.
	for _, img := range []string{fresh("before-0"), fresh("before-1")} {
		if err := pull(img, alicePod); err != nil {
			t.Fatalf("pull before the disk fills: %v", err)
		}
	}
	if w, r, c := state(); !w || !r || c == nil || !c.Status {
		t.Fatalf("before the disk fills: writable %v, ready %v, condition %+v", w, r, c)
	}

	t.Run("filled while pulls run, the condition, /readyz and the metric say so", func(t *testing.T) {
		filler := filepath.Join(dir, "filler")
		var wg sync.WaitGroup
		for i := range 4 {
			img := fresh(fmt.Sprintf("during-%d", i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				pull(img, alicePod) // refused or not: whichever write fails
			}()
		}
		// Ends with ENOSPC, as meant.
		exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run()
		wg.Wait()
		// More pulls, one at a time, until a write has failed (bounded):
		// bbolt re-uses its free pages for a while.
		unwritable := func() bool {
			_, metrics := httpGet(t, mon, "/metrics")
			return strings.Contains(metrics, "\ncri_image_proxy_ensure_records_writable 0")
		}
		for i := 0; i < 10 && !unwritable(); i++ {
			pull(fresh(fmt.Sprintf("after-%d", i)), alicePod)
		}
		writable, ready, c := state()
		if writable || ready || c == nil || c.Status || c.Reason != "RecordsDatabaseNotWritable" {
			t.Fatalf("with the database full: writable metric %v, /readyz 200 %v, condition %+v; want 0, 503, false RecordsDatabaseNotWritable", writable, ready, c)
		}
		if strings.Contains(c.Message, dir) {
			t.Errorf("the condition names the database's path: %q", c.Message)
		}
		log := p.proc.LogText()
		t.Logf("%s: %d pull(s) refused at their intent, %d record(s) not written; condition: %s", testRig.Runtime.Name,
			strings.Count(log, "noting a pull intent failed"), strings.Count(log, "recording a pull failed"), c.Message)
	})

	t.Run("no image pulled is shown to a tenant without credentials, or gives it a container", func(t *testing.T) {
		held := heldImages(t, testRig.Registry+"/full-db/")
		if len(held) < 2 {
			t.Fatalf("the runtime holds %d of the test's images", len(held))
		}
		t.Logf("the runtime holds %d of the test's images, %d of them pulled while it filled or full", len(held), len(held)-2)
		hiddenFromAStranger(t, p, "full-bob", held)
	})

	t.Run("space freed, all recovers by itself, with no pull", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, time.Minute, func() error {
			if w, r, c := state(); !w || !r || c == nil || !c.Status || c.Reason != "RecordsDatabaseOpen" {
				return fmt.Errorf("writable metric %v, /readyz 200 %v, condition %+v", w, r, c)
			}
			return nil
		})
		hiddenFromAStranger(t, p, "full-bob", heldImages(t, testRig.Registry+"/full-db/"))
	})

	t.Run("the next pull succeeds, and the puller re-uses what it pulled while the disk was full", func(t *testing.T) {
		if err := pull(fresh("recovered"), alicePod); err != nil {
			t.Fatalf("a pull once space is freed: %v", err)
		}
		for _, img := range heldImages(t, testRig.Registry+"/full-db/") {
			if err := pull(img.name, alicePod); err != nil {
				t.Errorf("A's pull of %s: %v", img.name, err)
			}
			if n := len(requestsDuring(t, testRig.Registry, func() {
				if err := pull(img.name, alice2); err != nil {
					t.Errorf("A's other pod's pull of %s: %v", img.name, err)
				}
			})); n != 0 {
				t.Errorf("A's other pod's pull of %s: %d registry requests, want a re-use", img.name, n)
			}
		}
	})
}
