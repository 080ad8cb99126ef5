package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestALateRefusalLeavesATrackedHiddenImage: the registry refuses a
// tenant's credential while the runtime still pulls the image through a
// mirror that serves anyone; the proxy stops the runtime's pull, and
// containerd may still create the image a moment after its client's
// cancel (2.x) or finish the pull (1.6). Whatever the runtime ends up
// holding, no tenant the registry did not verify sees it or runs it, by
// name or by ID; the owner still pulls and runs it.
//
// The registry's answer is delayed by a relay, swept from before the
// runtime's pull ends to after it, so that the refusal lands at every
// point of the pull; the rounds whose refusal came after the pull ended
// always leave the image (the test fails if none did: it would test
// nothing).
func TestALateRefusalLeavesATrackedHiddenImage(t *testing.T) {
	needRig(t)
	const regName = rigRegistryName
	if _, err := testRig.PushBusybox("late-a/app:v1", "a's private image, refused late"); err != nil {
		t.Fatal(err)
	}
	img := regName + "/late-a/app:v1"
	alice := newTenant(t, "late-alice", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "late-bob", "")
	carol := newTenant(t, "late-carol", "")
	rmi := func() { crictl(t, direct(), "rmi", img) }
	t.Cleanup(rmi)

	// The runtime pulls through a mirror that serves anyone (a little
	// slow, so that its pull has a middle); the registry check asks the
	// registry itself, behind a relay whose delay each round sets.
	mirror, err := rig.StartDelayRelay(testRig.AnonRegistry, 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mirror.Close)
	regPort := portOf(t, testRig.Registry)
	t.Cleanup(func() {
		if err := testRig.AddMirror(regName, regPort); err != nil {
			t.Errorf("taking the mirror of %s away: %v", regName, err)
		}
	})
	// The image's name needs no credential at the runtime, whose pulls go
	// to the mirror: CRI-O too, which sends none to a rewritten location.
	useServer := func(port int) {
		t.Helper()
		if err := testRig.SetMirror(regName, mirror.Port(), port); err != nil {
			t.Fatal(err)
		}
	}

	p := startEnsureProxy(t, "late-refusal")
	left, stopped := 0, 0
	for _, delay := range []time.Duration{0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 140, 160, 200} {
		delay *= time.Millisecond
		t.Run(fmt.Sprintf("the registry's refusal delayed %s", delay), func(t *testing.T) {
			rmi()
			server, err := rig.StartDelayRelay(testRig.Registry, delay)
			if err != nil {
				t.Fatal(err)
			}
			defer server.Close()
			useServer(server.Port())
			before := strings.Count(p.proc.LogText(), "a pull was stopped before the runtime said it finished")
			if r := bob.pull(t, p.ep, img); r.Err == nil {
				t.Fatalf("B's anonymous pull succeeded: %s", r.Stdout)
			}
			now := strings.Count(p.proc.LogText(), "a pull was stopped before the runtime said it finished") - before
			stopped += now
			// containerd creates a cancelled pull's image a moment after its
			// client went away (1.6 finishes the pull): give it that moment,
			// bounded, then look at what it holds.
			var id string
			var held bool
			for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if id, held = runtimeImage(t, img); held {
					break
				}
			}
			t.Logf("stopped before the runtime answered: %v; the runtime holds the image: %v", now > 0, held)
			if !held {
				return
			}
			left++
			if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
				t.Errorf("the proxy shows the image the refused pull left")
			}
			for _, tn := range []tenant{bob, carol} {
				for _, ref := range []string{img, id, strings.TrimPrefix(id, "sha256:")[:12]} {
					if err := tn.refused(t, p.ep, ref); err != nil {
						t.Errorf("an image a refused pull left: %v", err)
					}
				}
			}
		})
	}
	t.Logf("%d of the rounds left the image on the node; the proxy stopped the runtime's pull before it answered in %d", left, stopped)
	if left == 0 {
		t.Fatal("no round left the image on the node: the refusal never came after the runtime's pull, so this tested nothing")
	}
	t.Run("A pulls with its credential and runs the image; C still cannot", func(t *testing.T) {
		useServer(portOf(t, testRig.Registry))
		if r := alice.pull(t, p.ep, img); r.Err != nil {
			t.Fatalf("A's pull: %v\n%s", r.Err, r.Stderr)
		}
		if err := alice.creates(t, p.ep, img); err != nil {
			t.Errorf("A's container: %v", err)
		}
		if err := carol.refused(t, p.ep, img); err != nil {
			t.Errorf("C, of A's image: %v", err)
		}
	})
}
