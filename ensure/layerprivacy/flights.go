package layerprivacy

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// Flights are the pulls in flight whose layers the registry check
// has read: until their record is written, their layers count as private
// to every other pull (their credential's outcome is not known yet).
type Flights struct {
	mu sync.Mutex
	m  map[*Flight]struct{}
}

// Flight is one pull's entry: its layers are unknown until its
// registry check read the image's config (known, ready closed).
type Flight struct {
	imageID   string
	layers    []digest.Digest
	anonymous bool // the pull goes without a credential: node-wide whatever comes of it
	known     bool
	ready     chan struct{}
}

// NewFlights returns an empty set of pulls in flight.
func NewFlights() *Flights { return &Flights{m: map[*Flight]struct{}{}} }

// Start enters a pull, before the runtime is asked (so before it can
// unpack anything); End takes it out (after its record is written, or it
// failed).
func (f *Flights) Start() *Flight {
	fl := &Flight{ready: make(chan struct{})}
	f.mu.Lock()
	f.m[fl] = struct{}{}
	f.mu.Unlock()
	return fl
}

func (f *Flights) End(fl *Flight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, fl)
	fl.markKnown()
}

// markKnown ends the wait for fl's layers; f.mu is held.
func (fl *Flight) markKnown() {
	if !fl.known {
		fl.known = true
		close(fl.ready)
	}
}

// Set says which image and layers fl pulls.
func (f *Flights) Set(fl *Flight, imageID string, layers []digest.Digest, anonymous bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl.imageID, fl.layers, fl.anonymous = imageID, layers, anonymous
	fl.markKnown()
}

// WaitKnown waits until every other pull in flight knows its layers (or
// ended): the runtime may have unpacked a layer for one of them that this
// pull's image was then built from. It returns false when ctx ended
// first: those pulls' layers are then unknown.
func (f *Flights) WaitKnown(ctx context.Context, self *Flight) bool {
	f.mu.Lock()
	var pending []chan struct{}
	for fl := range f.m {
		if fl != self && !fl.known {
			pending = append(pending, fl.ready)
		}
	}
	f.mu.Unlock()
	for _, ready := range pending {
		select {
		case <-ready:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Holding reports whether a pull in flight other than self, with a
// credential, pulls an image holding d.
func (f *Flights) Holding(d digest.Digest, self *Flight) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fl := range f.m {
		if fl != self && !fl.anonymous && slices.Contains(fl.layers, d) {
			return true
		}
	}
	return false
}

// FlightWait bounds a pull's wait for the layers of the pulls in flight
// beside it.
const FlightWait = 2 * time.Minute
