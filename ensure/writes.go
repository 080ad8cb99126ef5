package ensure

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
)

// writeHealth follows the records database's writes: the first that fails
// makes it unwritable, with the kind of its cause; the next that succeeds
// makes it writable again. A GC run writes (its prune), so the state
// recovers by itself even when no pull comes.
type writeHealth struct {
	failing atomic.Pointer[writeFailure]
}

type writeFailure struct {
	cause string // the kind of failure, for the condition: no path
	err   error  // the whole error, for the operator's log
}

// note takes one write's outcome. A database that could not be opened at
// all is said elsewhere (RecordsAvailable).
func (h *writeHealth) note(err error) {
	switch {
	case err == nil:
		h.failing.Store(nil)
	case errors.Is(err, ErrRecordsUnavailable), errors.Is(err, ErrNotFound):
	default:
		h.failing.Store(&writeFailure{cause: writeCause(err), err: err})
	}
}

// err is nil while writes succeed.
func (h *writeHealth) err() error {
	if f := h.failing.Load(); f != nil {
		return fmt.Errorf("the records database does not take writes (%s): pulls are refused or their images need verification by every pod until it does: %w", f.cause, f.err)
	}
	return nil
}

// writeCause names the kind of a write failure, without its path.
func writeCause(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "no space left on its filesystem"
	case errors.Is(err, syscall.EROFS):
		return "its filesystem is read-only"
	case errors.Is(err, syscall.EIO):
		return "an I/O error"
	}
	return "writes fail"
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
