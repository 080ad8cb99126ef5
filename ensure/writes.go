package ensure

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	digest "github.com/opencontainers/go-digest"
)

// writeHealth follows the records database's writes: the first that fails
// makes it unwritable, with the kind of its cause; the next that succeeds
// makes it writable again. While it is unwritable, MendWrites probes the
// database, so the state recovers by itself even when no pull comes.
type writeHealth struct {
	failing atomic.Pointer[writeFailure]

	// wake tells MendWrites that a write failed. It holds one signal, so
	// a failure before MendWrites runs is not missed.
	wakeOnce sync.Once
	wake     chan struct{}
}

type writeFailure struct {
	cause string // the kind of failure, for the condition: no path
	err   error  // the whole error, for the operator's log
}

func newWriteFailure(err error) *writeFailure {
	return &writeFailure{cause: writeCause(err), err: err}
}

// note takes one write's outcome. A database that could not be opened at
// all is said elsewhere (RecordsAvailable).
func (h *writeHealth) note(err error) {
	switch {
	case err == nil:
		h.failing.Store(nil)
	case errors.Is(err, ErrRecordsUnavailable), errors.Is(err, ErrNotFound):
	default:
		h.failing.Store(newWriteFailure(err))
		select {
		case h.wakeup() <- struct{}{}:
		default: // already signalled
		}
	}
}

func (h *writeHealth) wakeup() chan struct{} {
	h.wakeOnce.Do(func() { h.wake = make(chan struct{}, 1) })
	return h.wake
}

// err is nil while writes succeed.
func (h *writeHealth) err() error {
	if f := h.failing.Load(); f != nil {
		return fmt.Errorf("the records database does not take writes (%s): pulls are refused or their images need verification by every pod until it does: %w", f.cause, f.err)
	}
	return nil
}

// writeCause names the kind of a write failure, without its path. bbolt
// gives some errors as text only (growing the file: "file resize error:
// ..."), so the errno's own text counts too.
func writeCause(err error) string {
	is := func(errno syscall.Errno) bool {
		return errors.Is(err, errno) || strings.Contains(err.Error(), errno.Error())
	}
	switch {
	case is(syscall.ENOSPC), is(syscall.EDQUOT):
		return "no space left on its filesystem"
	case is(syscall.EROFS):
		return "its filesystem is read-only"
	case is(syscall.EIO):
		return "an I/O error"
	}
	return "writes fail"
}

// The write probe's timing: the first probe a second after a write failed,
// then each wait twice the last, up to probeMaxWait, so that the database
// is found writable again within probeMaxWait of its fix. A probe that has
// not answered after probeTimeout is said in the log, and waited for:
// never two at a time.
const (
	probeFirstWait = time.Second
	probeMaxWait   = 5 * time.Second
	probeTimeout   = 10 * time.Second
)

// writeProber is a store that can check that it takes writes without
// changing what it holds (records.Store.ProbeWrite).
type writeProber interface {
	ProbeWrite() error
}

// afterClock is a clock that can wait (clock.Clock; a test's can be
// stepped).
type afterClock interface {
	After(time.Duration) <-chan time.Time
}

// MendWrites probes the records database while its writes fail, until ctx
// is done: readiness, the records condition and the writable metric come
// back within seconds of the fix (space freed, the filesystem writable
// again), without waiting for a pull. While writes succeed it only waits:
// no probe runs. A store that cannot probe (not the bbolt database) is
// left to the next write that succeeds.
func (g *Guard) MendWrites(ctx context.Context) {
	ws, _ := g.store.(watchedStore)
	prober, ok := ws.RecordStore.(writeProber)
	if !ok {
		return
	}
	h := g.writes
	after := time.After
	if c, ok := g.clock.(afterClock); ok {
		after = c.After
	}
	var inflight chan error // the probe running, if any
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wakeup():
		}
		f := h.failing.Load()
		if f == nil {
			continue
		}
		start := g.clock.Now()
		g.log.Warn("the records database does not take writes; probing it with a small write until it does", "cause", f.cause, "err", f.err,
			"remedy", "free space on, or repair, the filesystem of the database; see docs/operations.md")
		wait, probes, hung := probeFirstWait, 0, false
		for f != nil {
			select {
			case <-ctx.Done():
				return
			case <-after(wait):
			}
			wait = min(2*wait, probeMaxWait)
			if f = h.failing.Load(); f == nil {
				break // a write succeeded meanwhile
			}
			if inflight == nil {
				inflight = make(chan error, 1)
				go func(done chan<- error) { done <- prober.ProbeWrite() }(inflight)
				probes++
			}
			var err error
			select {
			case <-ctx.Done():
				return
			case err = <-inflight:
				inflight = nil
			case <-after(probeTimeout):
				if !hung {
					g.log.Warn("a write probe of the records database has not returned; its disk may hang", "after", probeTimeout)
					hung = true
				}
				continue // the same probe is waited for again
			}
			if err == nil {
				// Only the failure the probe was for: one of a write during
				// the probe stands.
				h.failing.CompareAndSwap(f, nil)
			} else {
				g.log.Debug("a write probe of the records database failed", "err", err)
				h.failing.CompareAndSwap(f, newWriteFailure(err))
			}
			f = h.failing.Load()
		}
		if inflight != nil {
			// A probe that hung through the episode: its outcome would be
			// stale in the next one.
			select {
			case <-ctx.Done():
				return
			case <-inflight:
				inflight = nil
			}
		}
		g.log.Info("the records database takes writes again", "after", g.clock.Since(start), "probes", probes)
	}
}

// watchedStore is a RecordStore whose writes report to a writeHealth.
type watchedStore struct {
	RecordStore
	health *writeHealth
}

func (s watchedStore) AddIntent(image string) (string, error) {
	id, err := s.RecordStore.AddIntent(image)
	s.health.note(err)
	return id, err
}

func (s watchedStore) DropIntent(id string) error {
	err := s.RecordStore.DropIntent(id)
	s.health.note(err)
	return err
}

func (s watchedStore) RecordPull(imageRef, repo string, cred Credential, intentID string, now time.Time, preloaded []string) error {
	err := s.RecordStore.RecordPull(imageRef, repo, cred, intentID, now, preloaded)
	s.health.note(err)
	return err
}

func (s watchedStore) RecordVerifiedPull(imageRef, repo string, cred Credential, diffIDs []digest.Digest, intentID string, now time.Time, preloaded []string) error {
	err := s.RecordStore.RecordVerifiedPull(imageRef, repo, cred, diffIDs, intentID, now, preloaded)
	s.health.note(err)
	return err
}

func (s watchedStore) Forget(imageRef string) (bool, error) {
	ok, err := s.RecordStore.Forget(imageRef)
	s.health.note(err)
	return ok, err
}

func (s watchedStore) Prune(present func(string) bool, until time.Time) (int, error) {
	n, err := s.RecordStore.Prune(present, until)
	s.health.note(err)
	return n, err
}

// Unavailable passes on the wrapped store's, if it has one.
func (s watchedStore) Unavailable() error {
	if u, ok := s.RecordStore.(interface{ Unavailable() error }); ok {
		return u.Unavailable()
	}
	return nil
}

// RecordsWritable returns nil while the records database takes writes,
// and otherwise why not, with the kind of cause.
func (g *Guard) RecordsWritable() error { return g.writes.err() }

// Ready is the guard's readiness: the records database is open and takes
// writes. The runtime path keeps serving either way (failing closed); this
// is for /readyz and the operator.
func (g *Guard) Ready(context.Context) error {
	if err := g.RecordsAvailable(); err != nil {
		return err
	}
	return g.RecordsWritable()
}
