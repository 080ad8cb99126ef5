package layerprivacy

import (
	"context"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
)

func TestPullsInFlight(t *testing.T) {
	t.Parallel()
	layer := digest.FromString("layer")
	for _, tc := range []struct {
		name        string
		setUp       func(f *Flights, self *Flight)
		wantHolding bool
		wantKnown   bool
	}{
		{
			name:      "a pull alone is known to itself",
			setUp:     func(*Flights, *Flight) {},
			wantKnown: true,
		},
		{
			name: "another pull whose layers are not read yet is waited for, and not known in time",
			setUp: func(f *Flights, _ *Flight) {
				f.Start()
			},
		},
		{
			name: "another pull with a credential holding the layer holds it",
			setUp: func(f *Flights, _ *Flight) {
				f.Set(f.Start(), "sha256:other", []digest.Digest{layer}, false)
			},
			wantHolding: true, wantKnown: true,
		},
		{
			name: "an anonymous pull holding the layer does not make it private",
			setUp: func(f *Flights, _ *Flight) {
				f.Set(f.Start(), "sha256:other", []digest.Digest{layer}, true)
			},
			wantKnown: true,
		},
		{
			name: "the pull itself is not counted as a holder",
			setUp: func(f *Flights, self *Flight) {
				f.Set(self, "sha256:self", []digest.Digest{layer}, false)
			},
			wantKnown: true,
		},
		{
			name: "a pull that ended holds nothing, and is not waited for",
			setUp: func(f *Flights, _ *Flight) {
				other := f.Start()
				f.Set(other, "sha256:other", []digest.Digest{layer}, false)
				f.End(other)
				f.End(f.Start())
			},
			wantKnown: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := NewFlights()
			self := f.Start()
			tc.setUp(f, self)
			if got := f.Holding(layer, self); got != tc.wantHolding {
				t.Errorf("Holding = %v, want %v", got, tc.wantHolding)
			}
			// A cancelled wait ends at once: what is not known by then is
			// unknown (the test does not depend on time).
			ctx, cancel := context.WithCancel(context.Background())
			if !tc.wantKnown {
				cancel()
			}
			defer cancel()
			if got := f.WaitKnown(ctx, self); got != tc.wantKnown {
				t.Errorf("WaitKnown = %v, want %v", got, tc.wantKnown)
			}
		})
	}
}

func TestAnObservationIsAwaitedOnlyWhileALookIsUnderWay(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	o := NewObservation()
	if o.Await(context.Background()) {
		t.Fatal("a node no look has observed counts as observed")
	}
	end := o.Looking()
	if o.Await(cancelled) {
		t.Fatal("a look under way that the caller stopped waiting for counts as observed")
	}
	done := make(chan bool)
	go func() { done <- o.Await(context.Background()) }()
	if !o.MarkObserved() || o.MarkObserved() {
		t.Fatal("MarkObserved is not true once, on the first look that succeeded")
	}
	if !<-done {
		t.Fatal("a decision waiting for the look under way did not see it succeed")
	}
	end()
	end() // twice: the look counts once
	if !o.Observed() || !o.Await(cancelled) {
		t.Fatal("an observed node does not stay observed")
	}
}

func TestImagesWhoseLayersAreUnknown(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	u := NewUnknown()
	if _, ok := u.EarliestBut(""); ok {
		t.Fatal("an empty table has an earliest image")
	}
	u.Add("sha256:a", t0.Add(time.Minute))
	u.Add("sha256:b", t0)
	u.Add("sha256:b", t0.Add(time.Hour)) // the first mark stands
	if at, ok := u.EarliestBut("sha256:a"); !ok || !at.Equal(t0) {
		t.Fatalf("EarliestBut(a) = %v, %v; want b's first mark", at, ok)
	}
	if at, ok := u.EarliestBut("sha256:b"); !ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("EarliestBut(b) = %v, %v; want a's", at, ok)
	}
	// A list taken before a's mark cannot show a: it stays; b, marked
	// before and not listed, goes.
	u.Retain(func(string) bool { return false }, t0.Add(30*time.Second))
	if at, ok := u.EarliestBut(""); !ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after Retain: %v, %v; want a alone", at, ok)
	}
	u.Drop("sha256:a")
	if _, ok := u.EarliestBut(""); ok {
		t.Fatal("a dropped image is still unknown")
	}
}
