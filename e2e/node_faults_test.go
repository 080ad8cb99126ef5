package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig"
)

// The scenarios of a proxy that fails: killed during pulls, and with its
// database full.

var restartsScenario = nodeScenario{
	name:   "proxy restarted and kill -9'd during pulls",
	images: []string{privateImage, "kill/app:v1"},
	run:    (*nodeEnv).scenarioRestarts,
}

// scenarioRestarts: the proxy killed while the kubelet starts pods; scenario
// 1's pod runs on undisturbed, and what scenario 1 verified holds.
func (e *nodeEnv) scenarioRestarts(t *testing.T) {
	kill := e.image("kill/app:v1")
	ctx := context.Background()
	steady, err := e.k.Admin.CoreV1().Pods(e.nsA).Get(ctx, "secret", metav1.GetOptions{})
	if err != nil || len(steady.Status.ContainerStatuses) != 1 {
		t.Fatalf("scenario 1's pod: %v", err)
	}
	steadyID := steady.Status.ContainerStatuses[0].ContainerID

	k1 := e.run(t, podSpec{ns: e.nsA, name: "kill-1", image: kill, policy: corev1.PullIfNotPresent, secret: "regcred"})
	k2 := e.run(t, podSpec{ns: e.nsA, name: "kill-2", image: kill, policy: corev1.PullIfNotPresent, secret: "regcred"})
	kb := e.run(t, podSpec{ns: e.nsB, name: "kill-b", image: kill, policy: corev1.PullIfNotPresent})
	// SIGKILL three times while the kubelet starts them, then a graceful
	// restart.
	for i := range 3 {
		time.Sleep(time.Duration(i) * 300 * time.Millisecond)
		e.proxy.proc.Kill()
		e.proxy.start(t)
	}
	e.proxy.proc.Stop(10 * time.Second)
	e.proxy.start(t)

	e.waitRunning(t, k1)
	e.waitRunning(t, k2)
	e.waitWaiting(t, kb, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, kb)

	steady, err = e.k.Admin.CoreV1().Pods(e.nsA).Get(ctx, "secret", metav1.GetOptions{})
	if err != nil || steady.Status.ContainerStatuses[0].ContainerID != steadyID || steady.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("scenario 1's running pod was disturbed: %s", containerState(steady))
	}
	// What was verified before the kills still holds, and nobody else gets in.
	private := e.image(privateImage)
	if _, n := e.runCounting(t, podSpec{ns: e.nsA, name: "after-kills", image: private, policy: corev1.PullIfNotPresent, secret: "regcred"}, private); n != 0 {
		t.Errorf("%d registry requests for A's verified image after the restarts, want 0", n)
	}
	never := e.run(t, podSpec{ns: e.nsB, name: "kill-never", image: kill, policy: corev1.PullNever})
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, never)
}

var fullDatabaseScenario = nodeScenario{
	name:   "the database full: A's record cannot be written; B's pods never run",
	images: []string{publicImage, privateImage, "full/app:v1"},
	run:    (*nodeEnv).scenarioFullDatabase,
}

// scenarioFullDatabase: the proxy's database fills up (a 1 MiB tmpfs,
// filled), so a verified pull cannot be recorded. Whichever write fails
// (the intent: A's pull is refused; the record: A runs), tenant B's pods
// must not run the image: it is never taken for a preloaded one. The
// proxy runs on a fresh database there, with two records written before
// the disk fills: then bbolt has room for the small intent and not for the
// record (measured), the case that matters, as the image is on the node.
func (e *nodeEnv) scenarioFullDatabase(t *testing.T) {
	full := e.image("full/app:v1")
	ctx := context.Background()
	dir := filepath.Join(testRig.Dir, "full-db-"+e.v.id)
	os.MkdirAll(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	defer exec.Command("umount", "-l", dir).Run()
	origDB := e.proxy.db
	useDB := func(path string) {
		t.Helper()
		e.proxy.proc.Stop(10 * time.Second)
		for i, a := range e.proxy.args {
			if a == e.proxy.db {
				e.proxy.args[i] = path
			}
		}
		e.proxy.db = path
		e.proxy.start(t)
	}
	useDB(filepath.Join(dir, "ensure.db"))
	defer useDB(origDB)
	mustCrictl(t, e.proxy.ep, "pull", e.anonymous(publicImage))
	mustCrictl(t, e.proxy.ep, "pull", "--creds", "alice:"+rig.Users["alice"], e.image(privateImage))
	filler := filepath.Join(dir, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run() // ends with ENOSPC, as meant
	defer os.Remove(filler)

	a := e.run(t, podSpec{ns: e.nsA, name: "full-a", image: full, policy: corev1.PullIfNotPresent, secret: "regcred"})
	a = e.waitFor(t, a, "Running, or failing its pull", 3*time.Minute, func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 {
			return false
		}
		st := p.Status.ContainerStatuses[0].State
		return st.Running != nil || (st.Waiting != nil && (st.Waiting.Reason == "ErrImagePull" || st.Waiting.Reason == "ImagePullBackOff"))
	})
	log := e.proxy.proc.LogText()
	recordFailed := strings.Contains(log, "recording a pull failed")
	intentFailed := strings.Contains(log, "noting a pull intent failed")
	if !recordFailed && !intentFailed {
		t.Fatalf("no write failed: the scenario tests nothing (A: %s)", containerState(a))
	}
	t.Logf("A: %s (record write failed: %v, intent write failed: %v)", containerState(a), recordFailed, intentFailed)

	bare := e.run(t, podSpec{ns: e.nsB, name: "full-b", image: full, policy: corev1.PullIfNotPresent})
	never := e.run(t, podSpec{ns: e.nsB, name: "full-b-never", image: full, policy: corev1.PullNever})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, bare)
	e.neverRan(t, never)
	t.Logf("B: %s; B Never: %s", e.eventSummary(bare), e.eventSummary(never))

	zero := int64(0)
	for _, p := range []*corev1.Pod{a, bare, never} {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, a, bare, never)
}
