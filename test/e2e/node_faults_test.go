package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The scenarios of a proxy that fails: killed during pulls, and with its
// database full; and of a kubelet restarted during a pull.

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
	steady := e.ensureRunning(t, e.aPulledWithSecret())
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

	steady, err := e.k.Admin.CoreV1().Pods(e.nsA).Get(ctx, "secret", metav1.GetOptions{})
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

var kubeletRestartScenario = nodeScenario{
	name:   "the kubelet restarted in the middle of A's private pull (a slow registry): A's pod runs after it; B's pods of another namespace get ErrImagePull and ErrImageNeverPull, never Running",
	images: []string{"slow/app:v1"},
	run:    (*nodeEnv).scenarioKubeletRestartMidPull,
}

// slowRegistry is the rig's registry under a name of its own, behind a
// relay that holds every chunk of data for slowDelay each way: a pull of
// it takes seconds, time to restart the kubelet in its middle.
const (
	slowRegistry = "registry.slow.test"
	slowDelay    = 400 * time.Millisecond
)

// scenarioKubeletRestartMidPull: the kubelet is restarted while the
// proxy forwards A's pull of a private image to the runtime (the pull has
// reached the registry for a blob): the kubelet's call is cut, and the
// runtime may or may not finish the pull. Whichever it did, B's pods,
// created while the kubelet is down, never run the image: the proxy tracks
// what a cut pull left, or keeps its intent until it knows. A's pod runs
// once the kubelet pulls again.
func (e *nodeEnv) scenarioKubeletRestartMidPull(t *testing.T) {
	relay, err := rig.StartDelayRelay(testRig.Registry, slowDelay)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// CRI-O sends no credential to a rewritten location: there, the
	// relay is the registry, by its own address.
	registry := slowRegistry
	if testRig.Runtime.CRIO() {
		registry = fmt.Sprintf("127.0.0.1:%d", relay.Port())
	}
	if err := testRig.AddMirror(registry, relay.Port()); err != nil {
		t.Fatal(err)
	}
	defer testRig.RemoveMirror(registry)
	createPullSecretFor(t, e.k, e.nsA, "regcred-slow", registry, "alice", rig.Users["alice"])
	path := e.repository() + "/slow/app"
	image := registry + "/" + path + ":v1"

	before := registryRequests(t)
	a := e.run(t, podSpec{ns: e.nsA, name: "slow-a", image: image, policy: corev1.PullIfNotPresent, secret: "regcred-slow"})
	// The runtime's pull fetches the image's blobs (GET); the proxy's
	// registry check only asks for them (HEAD).
	waitUntil(t, 2*time.Minute, func() error {
		for _, r := range registryLog(t, testRig.Registry)[before:] {
			if r.Method == http.MethodGet && strings.HasPrefix(r.Path, "/v2/"+path+"/blobs/") {
				return nil
			}
		}
		return fmt.Errorf("the runtime has fetched no blob of %s yet", image)
	})
	e.node.Pause()
	_, arrived := runtimeImage(t, image)
	b := e.run(t, podSpec{ns: e.nsB, name: "slow-b", image: image, policy: corev1.PullIfNotPresent})
	bNever := e.run(t, podSpec{ns: e.nsB, name: "slow-b-never", image: image, policy: corev1.PullNever})
	if err := e.node.Resume(""); err != nil {
		t.Fatal(err)
	}
	e.waitWaiting(t, b, "ErrImagePull", "ImagePullBackOff")
	e.waitWaiting(t, bNever, "ErrImageNeverPull")
	e.waitRunning(t, a)
	// And once A's pull again is recorded.
	bAfter := e.run(t, podSpec{ns: e.nsB, name: "slow-b-after", image: image, policy: corev1.PullNever})
	e.waitWaiting(t, bAfter, "ErrImageNeverPull")
	e.neverRan(t, b)
	e.neverRan(t, bNever)
	e.neverRan(t, bAfter)
	log := e.proxy.proc.LogText()
	t.Logf("the image was on the node when the kubelet came back: %v; the proxy tracked %d image(s) of failed pulls and kept %d intent(s) of cut pulls; B: %s",
		arrived, strings.Count(log, "failed, but the image arrived"), strings.Count(log, "a pull was cut before the runtime"), e.eventSummary(b))

	e.deletePods(t, a, b, bNever, bAfter)
}

// runtimeImage is the runtime's image ID of a name, asked directly, and
// whether it holds it.
func runtimeImage(t *testing.T, image string) (string, bool) {
	t.Helper()
	st, err := runtimeapi.NewImageServiceClient(mustDial(t, direct())).ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil || st.GetImage() == nil {
		return "", false
	}
	return st.Image.Id, true
}
