package ensure_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

// flakyDisk is a records store on a disk that fills up and is freed: its
// record writes fail with recordErr and its write probes with probeErr.
// Intents and reads always work (bbolt's free pages hold an intent).
type flakyDisk struct {
	*ensuretest.MemoryStore
	mu                  sync.Mutex
	recordErr, probeErr error
	probes              int
	// duringProbe, when set, runs inside each probe, before it answers.
	duringProbe func()
}

func (d *flakyDisk) set(recordErr, probeErr error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recordErr, d.probeErr = recordErr, probeErr
}

func (d *flakyDisk) setDuringProbe(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.duringProbe = f
}

func (d *flakyDisk) probeCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.probes
}

func (d *flakyDisk) RecordPull(imageRef, repo string, cred ensure.Credential, intentID string, now time.Time, preloaded []string) error {
	d.mu.Lock()
	err := d.recordErr
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.MemoryStore.RecordPull(imageRef, repo, cred, intentID, now, preloaded)
}

func (d *flakyDisk) ProbeWrite() error {
	d.mu.Lock()
	d.probes++
	during := d.duringProbe
	d.mu.Unlock()
	if during != nil {
		during()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.probeErr
}

// stepClock is a clock whose waits the test ends: each After is handed to
// the test (asked), and returns when the test fires it. Nothing waits on
// wall time.
type stepClock struct {
	*testclock.FakePassiveClock
	asked chan stepTimer
	done  <-chan struct{}
}

type stepTimer struct {
	d    time.Duration
	fire chan time.Time
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	tm := stepTimer{d: d, fire: make(chan time.Time, 1)}
	select {
	case c.asked <- tm:
	case <-c.done:
	}
	return tm.fire
}

// next is the next wait the guard asks for.
func (c *stepClock) next(t *testing.T) stepTimer {
	t.Helper()
	select {
	case tm := <-c.asked:
		return tm
	case <-time.After(10 * time.Second): // a guard against a hang, not a synchronisation
		t.Fatal("the guard asked for no wait")
	}
	panic("unreachable")
}

// fire ends a wait, the clock moved on by its duration.
func (c *stepClock) fire(tm stepTimer) {
	c.SetTime(c.Now().Add(tm.d))
	tm.fire <- c.Now()
}

// noWait checks that the guard asks for no wait now.
func (c *stepClock) noWait(t *testing.T, when string) {
	t.Helper()
	select {
	case tm := <-c.asked:
		t.Errorf("%s: the guard waits %v (to probe)", when, tm.d)
	default:
	}
}

// messages is a slog handler that hands each message to the test as well,
// once it is written: a test that awaited it finds it in the log.
type messages struct {
	slog.Handler
	c chan string
}

func (m messages) Handle(ctx context.Context, r slog.Record) error {
	err := m.Handler.Handle(ctx, r)
	select {
	case m.c <- r.Message:
	default:
	}
	return err
}

func (m messages) WithAttrs(as []slog.Attr) slog.Handler {
	return messages{m.Handler.WithAttrs(as), m.c}
}

// await reads the guard's log until msg.
func (m messages) await(t *testing.T, msg string) {
	t.Helper()
	for {
		select {
		case got := <-m.c:
			if got == msg {
				return
			}
		case <-time.After(10 * time.Second): // a guard against a hang
			t.Fatalf("the guard never logged %q", msg)
		}
	}
}

// mendSetup is a guard over a flaky disk, mending its writes.
type mendSetup struct {
	*setup
	disk  *flakyDisk
	clock *stepClock
	log   messages
	reg   *prometheus.Registry
}

const recovered = "the records database takes writes again"

func newMendSetup(t *testing.T) *mendSetup {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	disk := &flakyDisk{MemoryStore: ensuretest.NewMemoryStore()}
	m := &mendSetup{
		setup: &setup{node: newFakeNode(), store: disk, log: &syncBuffer{}},
		disk:  disk,
		clock: &stepClock{FakePassiveClock: testclock.NewFakePassiveClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)), asked: make(chan stepTimer), done: ctx.Done()},
		reg:   prometheus.NewRegistry(),
	}
	m.node.serve(private, refApp, "alice:a-pw", "bob:b-pw")
	m.log = messages{slog.NewTextHandler(m.setup.log, &slog.HandlerOptions{Level: slog.LevelDebug}), make(chan string, 1000)}
	p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
	g, err := ensure.NewGuard(disk, p, ensure.CRIRuntime(m.node, m.node), ensure.GuardOptions{Clock: m.clock, Logger: slog.New(m.log), Registerer: m.reg})
	if err != nil {
		t.Fatal(err)
	}
	m.guard = g
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.MendWrites(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m
}

// state is what the node says of the records: readiness, the condition in
// the runtime's status, the writable metric.
func (m *mendSetup) state(t *testing.T) (ready error, condition *runtimeapi.RuntimeCondition, writable float64) {
	t.Helper()
	resp, err := m.guard.Status(context.Background(), &runtimeapi.StatusRequest{}, func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
		return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	writable = -1
	for _, mf := range mfs {
		if mf.GetName() == "cri_image_proxy_ensure_records_writable" {
			writable = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return m.guard.Ready(context.Background()), resp.Status.Conditions[0], writable
}

func (m *mendSetup) wantWritable(t *testing.T, when string) {
	t.Helper()
	if err, c, w := m.state(t); err != nil || !c.Status || c.Reason != "RecordsDatabaseOpen" || w != 1 {
		t.Errorf("%s: ready %v, condition %v, writable metric %v; want ready, true, 1", when, err, c, w)
	}
}

func (m *mendSetup) wantNotWritable(t *testing.T, when string) {
	t.Helper()
	if err, c, w := m.state(t); err == nil || c.Status || c.Reason != "RecordsDatabaseNotWritable" || w != 0 {
		t.Errorf("%s: ready %v, condition %v, writable metric %v; want not ready, false RecordsDatabaseNotWritable, 0", when, err, c, w)
	}
}

// fill makes the disk full and has A pull: its record write fails.
func (m *mendSetup) fill(t *testing.T) {
	t.Helper()
	full := &os.PathError{Op: "write", Path: "/var/lib/cri-image-proxy/ensure.db", Err: syscall.ENOSPC}
	m.disk.set(full, full)
	if got := m.start(podA, private, "Always"); got != running {
		t.Fatalf("A's pull with the disk full: %s", got)
	}
	m.wantNotWritable(t, "with the disk full")
}

// probeTimeout is the guard's bound on a probe's answer (writes.go).
const probeTimeout = 10 * time.Second

func TestADatabaseThatCannotWriteIsProbedUntilItCan(t *testing.T) {
	t.Parallel()

	t.Run("writes fail, then the disk is freed: readiness, the condition and the metric come back with no pull, and no probe runs while writes succeed", func(t *testing.T) {
		t.Parallel()
		m := newMendSetup(t)
		for _, p := range []pod{podA, podA2} {
			if got := m.start(p, private, "Always"); got != running {
				t.Fatalf("a pull with the disk healthy: %s", got)
			}
		}
		m.clock.noWait(t, "while writes succeed")
		if n := m.disk.probeCount(); n != 0 {
			t.Errorf("%d probes while writes succeed, want none", n)
		}
		m.wantWritable(t, "while writes succeed")

		m.fill(t)
		// Backing off: 1s, 2s, 4s, then every 5s; each probe is given
		// probeTimeout to answer (it answers at once here).
		var waits []time.Duration
		for range 5 {
			tm := m.clock.next(t)
			waits = append(waits, tm.d)
			m.clock.fire(tm)
			if to := m.clock.next(t); to.d != probeTimeout {
				t.Fatalf("after a probe began, a wait of %v, want its timeout %v", to.d, probeTimeout)
			}
		}
		if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}; !slices.Equal(waits, want) {
			t.Errorf("waits between probes %v, want %v", waits, want)
		}
		last := m.clock.next(t) // the fifth probe has failed: the sixth is due
		if n := m.disk.probeCount(); n != 5 {
			t.Errorf("%d probes, want 5", n)
		}
		m.wantNotWritable(t, "while probes fail")

		pulls := m.node.requests
		m.disk.set(nil, nil) // space freed
		m.clock.fire(last)
		m.clock.next(t) // the probe's timeout
		m.log.await(t, recovered)
		m.wantWritable(t, "once a probe succeeded")
		if m.node.requests != pulls {
			t.Errorf("%d pulls while the database mended, want none", m.node.requests-pulls)
		}
		if n := strings.Count(m.setup.log.String(), recovered); n != 1 {
			t.Errorf("the recovery logged %d times, want once", n)
		}
		if got := m.start(podB, private, "IfNotPresent"); got == running {
			t.Errorf("B without credentials: %s, want refused", got)
		}
		if got := m.start(podA, private, "Always"); got != running {
			t.Errorf("A once the disk is freed: %s", got)
		}
		m.clock.noWait(t, "once writes succeed again")
		if n := m.disk.probeCount(); n != 6 {
			t.Errorf("%d probes, want 6: none after the recovery", n)
		}
	})

	t.Run("a write that fails while a probe succeeds is not hidden by it", func(t *testing.T) {
		t.Parallel()
		m := newMendSetup(t)
		m.fill(t)
		m.disk.set(nil, nil)
		m.disk.setDuringProbe(func() {
			m.disk.setDuringProbe(nil)
			// A pull's record write fails in the middle of the probe (a
			// larger write, with less space than the probe found).
			m.disk.set(&os.PathError{Op: "write", Path: "ensure.db", Err: syscall.EIO}, nil)
			if got := m.start(podA2, private, "Always"); got != running {
				t.Errorf("A's second pull: %s", got)
			}
			m.disk.set(nil, nil)
		})
		m.clock.fire(m.clock.next(t))
		m.clock.next(t) // the probe's timeout
		tm := m.clock.next(t)
		if tm.d != 2*time.Second {
			t.Errorf("after the probe, a wait of %v, want 2s: probing goes on", tm.d)
		}
		m.wantNotWritable(t, "after a probe that succeeded while a write failed")
		if _, c, _ := m.state(t); !strings.Contains(c.Message, "I/O error") {
			t.Errorf("condition %q, want the failure of the write (an I/O error)", c.Message)
		}
		m.clock.fire(tm)
		m.clock.next(t)
		m.log.await(t, recovered)
		m.wantWritable(t, "after the next probe")
	})

	t.Run("a probe that does not answer is waited for: never two at once", func(t *testing.T) {
		t.Parallel()
		m := newMendSetup(t)
		m.fill(t)
		m.disk.set(nil, nil)
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		m.disk.setDuringProbe(func() {
			started <- struct{}{}
			<-release
		})
		m.clock.fire(m.clock.next(t)) // the first probe is due
		<-started
		for range 3 {
			to := m.clock.next(t)
			if to.d != probeTimeout {
				t.Fatalf("a wait of %v, want the probe's timeout", to.d)
			}
			if n := m.disk.probeCount(); n != 1 {
				t.Fatalf("%d probes while the first hangs, want 1", n)
			}
			m.wantNotWritable(t, "while the probe hangs")
			m.clock.fire(to)              // it passes
			m.clock.fire(m.clock.next(t)) // the next probe would be due
		}
		m.clock.next(t) // the hung probe's timeout, again
		close(release)
		m.log.await(t, recovered)
		m.wantWritable(t, "once the probe answered")
		if n := m.disk.probeCount(); n != 1 {
			t.Errorf("%d probes, want the one that hung", n)
		}
		if n := strings.Count(m.setup.log.String(), "has not returned"); n != 1 {
			t.Errorf("the hung probe logged %d times, want once", n)
		}
	})

	t.Run("a write that succeeds ends the probing", func(t *testing.T) {
		t.Parallel()
		m := newMendSetup(t)
		m.fill(t)
		first := m.clock.next(t)
		m.disk.set(nil, &os.PathError{Op: "write", Path: "ensure.db", Err: syscall.ENOSPC})
		if got := m.start(podA2, private, "Always"); got != running {
			t.Fatalf("A's pull once space is freed: %s", got)
		}
		m.wantWritable(t, "once a write succeeded")
		m.clock.fire(first)
		m.log.await(t, recovered)
		m.clock.noWait(t, "once a write succeeded")
		if n := m.disk.probeCount(); n != 0 {
			t.Errorf("%d probes, want none", n)
		}
	})

	t.Run("a store that cannot probe is left to its writes", func(t *testing.T) {
		t.Parallel()
		p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
		g, err := ensure.NewGuard(ensuretest.NewMemoryStore(), p, ensure.CRIRuntime(newFakeNode(), newFakeNode()), ensure.GuardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g.MendWrites(context.Background()) // returns at once
	})
}
