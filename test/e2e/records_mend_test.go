package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The records database mends by itself: while its writes fail, the proxy
// probes it, so that once the disk is fixed readiness, the records
// condition and the writable metric come back with no pull and no GC run
// (the default 5 minutes here).

const (
	recoveredLine   = "the records database takes writes again"
	failedProbeLine = "a write probe of the records database failed"
)

// mendingProxy is an ensure proxy whose database is in a directory the
// test mounts, with its monitoring address and its debug log (a failed
// probe is logged at debug level).
type mendingProxy struct {
	*ensureProxy
	mon, dir string
}

func startMendingProxy(t *testing.T, name string, mount func(dir string)) *mendingProxy {
	t.Helper()
	dir := filepath.Join(testRig.Dir, "ensure-"+name) // startEnsureProxy's
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(dir)
	mon := freeAddr(t)
	return &mendingProxy{startEnsureProxy(t, name, "--monitoring-address", mon, "--log-level", "debug"), mon, dir}
}

// state is readiness, the writable metric and the records condition.
func (p *mendingProxy) state(t *testing.T) (ready, writable bool, c *condition) {
	t.Helper()
	code, _ := httpGet(t, p.mon, "/readyz")
	_, metrics := httpGet(t, p.mon, "/metrics")
	return code == 200, strings.Contains(metrics, "\ncri_image_proxy_ensure_records_writable 1"), recordsCondition(t, p.ep)
}

func (p *mendingProxy) wantNotWritable(t *testing.T, when, cause string) {
	t.Helper()
	ready, writable, c := p.state(t)
	if ready || writable || c == nil || c.Status || c.Reason != "RecordsDatabaseNotWritable" || !strings.Contains(c.Message, cause) {
		t.Fatalf("%s: /readyz 200 %v, writable metric %v, condition %+v; want 503, 0, false RecordsDatabaseNotWritable saying %q", when, ready, writable, c, cause)
	}
}

// waitFailedProbes waits until the proxy has logged n failed probes more
// than it had (bounded: probes back off to one every 5 s).
func (p *mendingProxy) waitFailedProbes(t *testing.T, n int) {
	t.Helper()
	before := strings.Count(p.proc.LogText(), failedProbeLine)
	waitUntil(t, time.Minute, func() error {
		if got := strings.Count(p.proc.LogText(), failedProbeLine) - before; got < n {
			return fmt.Errorf("%d failed write probes logged, want %d", got, n)
		}
		return nil
	})
}

// waitMended waits for readiness, the metric and the condition to come
// back, and returns how long that took (an observation), checking that the
// registry saw no request meanwhile and that a probe found it.
func (p *mendingProxy) waitMended(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	var took time.Duration
	if reqs := requestsDuring(t, testRig.Registry, func() {
		waitUntil(t, 30*time.Second, func() error {
			if ready, writable, c := p.state(t); !ready || !writable || c == nil || !c.Status || c.Reason != "RecordsDatabaseOpen" {
				return fmt.Errorf("/readyz 200 %v, writable metric %v, condition %+v", ready, writable, c)
			}
			return nil
		})
		took = time.Since(start)
	}); len(reqs) != 0 {
		t.Errorf("%d registry requests while the database mended, want none: %v", len(reqs), reqs)
	}
	log := p.proc.LogText()
	if n := strings.Count(log, recoveredLine); n != 1 {
		t.Errorf("the recovery logged %d times, want once", n)
	}
	if m := regexp.MustCompile(recoveredLine + `.* probes=(\d+)`).FindStringSubmatch(log); m == nil || m[1] == "0" {
		t.Errorf("the recovery was not found by a probe: %q", m)
	}
	return took
}

// TestARecordsDatabaseMendsItselfWithoutAPull: the records database on a
// filesystem that fills up until a pull's record write fails, then is
// freed; and on one the kernel makes read-only, as after an I/O error.
func TestARecordsDatabaseMendsItselfWithoutAPull(t *testing.T) {
	needRig(t)
	alice := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}

	t.Run("a full filesystem, freed: ready again with no pull", func(t *testing.T) {
		p := startMendingProxy(t, "mend-full", func(dir string) {
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
				t.Fatalf("mount a tmpfs: %v\n%s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
		})
		fresh := newFreshImages(t, "mend-full/").push
		images := runtimeapi.NewImageServiceClient(mustDial(t, p.ep))
		alicePod, alice2 := sandboxConfig(t, "mend-alice", "mend-alice-uid"), sandboxConfig(t, "mend-alice2", "mend-alice2-uid")
		pull := func(image string, pod *runtimeapi.PodSandboxConfig) error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			return kubeletPull(ctx, images, image, alice, pod)
		}
		// Records before the disk fills: bbolt has free pages then, room
		// for some writes and not for others.
		before := []string{fresh("before-0"), fresh("before-1")}
		for _, img := range before {
			if err := pull(img, alicePod); err != nil {
				t.Fatalf("a pull before the disk fills: %v", err)
			}
		}
		if ready, writable, c := p.state(t); !ready || !writable || c == nil || !c.Status {
			t.Fatalf("before the disk fills: /readyz 200 %v, writable %v, condition %+v", ready, writable, c)
		}
		if strings.Contains(p.proc.LogText(), failedProbeLine) {
			t.Errorf("a write probe ran while writes succeed")
		}

		filler := filepath.Join(p.dir, "filler")
		exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run() // ends with ENOSPC, as meant
		// Pulls one at a time until a write has failed (bounded).
		for i := 0; i < 10; i++ {
			pull(fresh(fmt.Sprintf("during-%d", i)), alicePod) // refused or not: whichever write fails
			if _, writable, _ := p.state(t); !writable {
				break
			}
		}
		p.wantNotWritable(t, "with the disk full", "no space")
		// The probes fail as the record write did: nothing is said ready
		// while the disk stays full.
		p.waitFailedProbes(t, 3)
		p.wantNotWritable(t, "after three failed probes", "no space")
		log := p.proc.LogText()
		t.Logf("%s: %d pull(s) refused at their intent, %d record(s) not written; %d failed probes logged",
			testRig.Runtime.Name, strings.Count(log, "noting a pull intent failed"), strings.Count(log, "recording a pull failed"), strings.Count(log, failedProbeLine))

		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		took := p.waitMended(t)
		t.Logf("%s: ready again %v after the space was freed (an observation)", testRig.Runtime.Name, took.Round(10*time.Millisecond))

		if err := pull(fresh("after"), alicePod); err != nil {
			t.Errorf("a pull once space is freed: %v", err)
		}
		for _, img := range before {
			if n := len(requestsDuring(t, testRig.Registry, func() {
				if err := pull(img, alice2); err != nil {
					t.Errorf("A's other pod's pull of %s: %v", img, err)
				}
			})); n != 0 {
				t.Errorf("A's other pod's pull of %s, recorded before the disk filled: %d registry requests, want a re-use", img, n)
			}
		}
		if _, writable, _ := p.state(t); !writable {
			t.Errorf("not writable after the pulls that followed the recovery")
		}
	})

	t.Run("a filesystem the kernel made read-only: never said ready while it is, reads go on, ready after its repair", func(t *testing.T) {
		img := filepath.Join(testRig.Dir, "mend-ro.ext4")
		var dev string
		p := startMendingProxy(t, "mend-ro", func(dir string) {
			for _, c := range [][]string{
				{"truncate", "-s", "32M", img},
				{"mkfs.ext4", "-q", "-F", img},
				{"mount", "-o", "loop,errors=remount-ro", img, dir},
			} {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
				}
			}
			t.Cleanup(func() { exec.Command("umount", "-l", dir).Run(); os.Remove(img) })
			out, err := exec.Command("findmnt", "-no", "SOURCE", dir).Output()
			if err != nil {
				t.Fatalf("findmnt: %v", err)
			}
			dev = filepath.Base(strings.TrimSpace(string(out)))
		})
		trigger := filepath.Join("/sys/fs/ext4", dev, "trigger_fs_error")
		if _, err := os.Stat(trigger); err != nil {
			t.Skipf("this kernel has no %s: %v", trigger, err)
		}
		fresh := newFreshImages(t, "mend-ro/").push
		images := runtimeapi.NewImageServiceClient(mustDial(t, p.ep))
		alicePod, alice2 := sandboxConfig(t, "mend-ro-alice", "mend-ro-alice-uid"), sandboxConfig(t, "mend-ro-alice2", "mend-ro-alice2-uid")
		pull := func(image string, pod *runtimeapi.PodSandboxConfig) error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			return kubeletPull(ctx, images, image, alice, pod)
		}
		before := fresh("before")
		if err := pull(before, alicePod); err != nil {
			t.Fatalf("a pull before: %v", err)
		}

		// An operator's remount: Linux refuses to make a filesystem
		// read-only while a file on it is open for writing, as the
		// database is.
		out, err := exec.Command("mount", "-o", "remount,ro", p.dir).CombinedOutput()
		t.Logf("mount -o remount,ro with the proxy running: %v %s", err, strings.TrimSpace(string(out)))
		// The kernel's own, as after an I/O error (errors=remount-ro).
		if err := os.WriteFile(trigger, []byte("1"), 0o200); err != nil {
			t.Fatal(err)
		}
		if err := pull(fresh("during"), alicePod); err == nil {
			t.Errorf("a pull with the database read-only succeeded: its intent cannot be written")
		}
		p.wantNotWritable(t, "with the filesystem read-only", "read-only")
		p.waitFailedProbes(t, 3)
		p.wantNotWritable(t, "after three failed probes", "read-only")
		// Reads go on: the probes did not cost the proxy its mapping of
		// the file (a re-use reads the record, and writes nothing).
		if n := len(requestsDuring(t, testRig.Registry, func() {
			if err := pull(before, alice2); err != nil {
				t.Errorf("A's other pod's pull, the filesystem read-only: %v", err)
			}
		})); n != 0 {
			t.Errorf("A's other pod's pull of the image recorded before, the filesystem read-only: %d registry requests, want a re-use", n)
		}

		// It stays read-only until unmounted, which needs the proxy
		// stopped: stop, repair, mount, start.
		p.proc.Stop(10 * time.Second)
		for _, c := range [][]string{
			{"umount", p.dir},
			{"e2fsck", "-fy", img},
			{"mount", "-o", "loop,errors=remount-ro", img, p.dir},
		} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil && !(c[0] == "e2fsck" && exitCode(err) == 1) {
				t.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
			}
		}
		p.start(t)
		waitUntil(t, 30*time.Second, func() error {
			if ready, writable, c := p.state(t); !ready || !writable || c == nil || !c.Status {
				return fmt.Errorf("/readyz 200 %v, writable metric %v, condition %+v", ready, writable, c)
			}
			return nil
		})
		if n := len(requestsDuring(t, testRig.Registry, func() {
			if err := pull(before, alice2); err != nil {
				t.Errorf("A's other pod's pull after the repair: %v", err)
			}
		})); n != 0 {
			t.Errorf("A's other pod's pull of the image recorded before, after the repair: %d registry requests, want a re-use", n)
		}
		if err := pull(fresh("after"), alicePod); err != nil {
			t.Errorf("a pull after the repair: %v", err)
		}
	})
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
