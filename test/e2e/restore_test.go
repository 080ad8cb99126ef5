package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestRecordsRestore restores an older backup of the records database on
// a node where, since the backup, tenant A pulled another private image
// through the proxy and an image was preloaded (pulled on containerd
// directly). As a control, the backup copied into place by hand shows
// A's new image to B (it passes for preloaded). records restore instead
// marks every image on the node the backup does not know as pulled with
// no verified credential, except the one named --preloaded: B is not
// shown A's new image, A's pod verifies it once at the registry, A's
// older image is re-used as the backup recorded it, and the preloaded
// image stays free. While the daemon runs, or without the runtime, the
// restore changes nothing.
func TestRecordsRestore(t *testing.T) {
	needRig(t)
	p := startEnsureProxy(t, "restore")
	older, since, preloaded := testRig.Registry+"/restore/older:v1", testRig.Registry+"/restore/since:v1", testRig.Registry+"/restore/preloaded:v1"
	for _, img := range []string{older, since, preloaded} {
		// Images of a layer of their own: a base layer shared with A's
		// private image would make the proxy take an image pulled around it
		// since for one that came with another tenant's content (which the
		// control means to show it cannot tell without the records).
		ref := strings.TrimPrefix(img, testRig.Registry+"/")
		if _, err := testRig.PushMarker(ref, "restore "+ref); err != nil {
			t.Fatal(err)
		}
		crictl(t, direct(), "rmi", img)
		t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	}
	alice := newTenant(t, "restore-a", "alice:"+rig.Users["alice"])
	alice2 := newTenant(t, "restore-a2", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "restore-b", "")
	shownToB := func(img string) bool { return crictl(t, p.ep, "inspecti", img).Err == nil }

	// The backup knows the older image; since and preloaded come after.
	if r := alice.pull(t, p.ep, older); r.Err != nil {
		t.Fatalf("A's pull of %s: %v\n%s", older, r.Err, r.Stderr)
	}
	p.proc.Stop(10 * time.Second)
	backup := p.db + ".backup"
	data, err := os.ReadFile(p.db)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backup, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p.start(t)
	if r := alice.pull(t, p.ep, since); r.Err != nil {
		t.Fatalf("A's pull of %s: %v\n%s", since, r.Err, r.Stderr)
	}
	if r := crictl(t, direct(), "pull", "--creds", "user:"+rig.Users["user"], preloaded); r.Err != nil {
		t.Fatalf("preloading %s: %v\n%s", preloaded, r.Err, r.Stderr)
	}
	if shownToB(since) || !shownToB(preloaded) {
		t.Fatalf("before any restore: B is shown %s: %v, %s: %v; want hidden, shown", since, shownToB(since), preloaded, shownToB(preloaded))
	}
	current, err := os.ReadFile(p.db)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("while the daemon runs the restore is refused, naming the unit to stop", func(t *testing.T) {
		out, err := p.records(t, "restore", backup)
		if err == nil || !strings.Contains(out, "systemctl stop cri-image-proxy") || !strings.Contains(out, "nothing restored") {
			t.Errorf("restore with the daemon running: %v\n%s", err, out)
		}
	})

	p.proc.Stop(10 * time.Second)

	t.Run("without the runtime the restore is refused", func(t *testing.T) {
		res, err := exec.Command(proxyBin, "records", "restore", backup, "--database", p.db, "--admin-socket", p.admin,
			"--runtime-endpoint", "unix://"+filepath.Join(testRig.Dir, "no-runtime.sock")).CombinedOutput()
		out := string(res)
		if err == nil || !strings.Contains(out, "nothing restored") {
			t.Errorf("restore without the runtime: %v\n%s", err, out)
		}
	})

	t.Run("refused restores changed nothing", func(t *testing.T) {
		if now, _ := os.ReadFile(p.db); !bytes.Equal(now, current) {
			t.Errorf("the database changed")
		}
	})

	t.Run("control: the backup copied into place by hand shows B the image A pulled since", func(t *testing.T) {
		if err := os.WriteFile(p.db, data, 0o600); err != nil {
			t.Fatal(err)
		}
		p.start(t)
		defer p.proc.Stop(10 * time.Second)
		if !shownToB(since) {
			t.Errorf("the premise does not hold: with the older file in place %s is hidden from B", since)
		}
	})

	replaced, err := os.ReadFile(p.db)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.records(t, "restore", backup, "--preloaded", preloaded)
	t.Logf("records restore:\n%s", out)
	if err != nil {
		t.Fatalf("records restore: %v", err)
	}
	kept := regexp.MustCompile(`kept as (\S+)`).FindStringSubmatch(out)
	if kept == nil {
		t.Errorf("the restore does not say where the file it replaced is")
	} else if old, err := os.ReadFile(kept[1]); err != nil || !bytes.Equal(old, replaced) {
		t.Errorf("%s is not the file the restore replaced (%v)", kept[1], err)
	}
	p.start(t)

	t.Run("B is not shown the image A pulled since the backup, and fails at the registry", func(t *testing.T) {
		if shownToB(since) {
			t.Fatalf("ImageStatus shows B %s after the restore", since)
		}
		if r := bob.pull(t, p.ep, since); r.Err == nil {
			t.Errorf("B pulled %s without credentials", since)
		}
	})

	t.Run("A's pod verifies the image pulled since once, at the registry", func(t *testing.T) {
		if n := alice2.pullCountingRequests(t, p.ep, since); n == 0 {
			t.Errorf("A's pod re-used %s without a registry request", since)
		}
	})

	t.Run("the image the backup knows is re-used as it recorded", func(t *testing.T) {
		if shownToB(older) {
			t.Errorf("%s is shown to B", older)
		}
		if n := alice2.pullCountingRequests(t, p.ep, older); n != 0 {
			t.Errorf("%d registry requests for A's verified re-use of %s, want 0", n, older)
		}
	})

	t.Run("the image named preloaded stays free", func(t *testing.T) {
		if !shownToB(preloaded) {
			t.Errorf("%s, named preloaded, is hidden from B", preloaded)
		}
	})
}
