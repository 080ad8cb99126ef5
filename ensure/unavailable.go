package ensure

import (
	"errors"

	"fmt"
	"time"

	digest "github.com/opencontainers/go-digest"
)

// ErrRecordsUnavailable is the error of every record read or write while
// the records database cannot be opened.
var ErrRecordsUnavailable = errors.New("the records database is unavailable")

// UnavailableStore stands in for a records database that could not be
// opened (corrupt, written by a newer version, a full or read-only disk),
// so that the proxy still serves the runtime (the kubelet's node stays
// Ready) while the guard fails closed: every read and write errs, so every
// present image needs verification (ImageStatus hides it), every pull
// through the guard is refused, since it could not be recorded, and
// CreateContainer refuses every image no pod was granted. cause is the
// open error, for the operator.
func UnavailableStore(cause error) RecordStore { return unavailableStore{cause: cause} }

type unavailableStore struct{ cause error }

func (s unavailableStore) err() error { return fmt.Errorf("%w: %w", ErrRecordsUnavailable, s.cause) }

func (s unavailableStore) Get(string) (*Record, error) { return nil, s.err() }

// HashAuth returns a value no salted hash ever takes (those are hex), so
// that nothing compares equal to it; "" would mean "no credential".
func (unavailableStore) HashAuth(Auth) string { return "(records unavailable)" }

func (s unavailableStore) AddIntent(string) (string, error) { return "", s.err() }
func (s unavailableStore) DropIntent(string) error          { return s.err() }

// Intents has none to give: the intents on disk are unreadable, and with
// every image needing verification they would change nothing.
func (unavailableStore) Intents() ([]Intent, error) { return nil, nil }

func (s unavailableStore) RecordPull(string, string, Credential, string, time.Time, []string) error {
	return s.err()
}

// Preloaded knows none: every present image needs verification anyway.
func (unavailableStore) Preloaded(string) []string     { return nil }
func (s unavailableStore) Forget(string) (bool, error) { return false, s.err() }
func (s unavailableStore) Counts() (int, int, error)   { return 0, 0, s.err() }
func (s unavailableStore) Restricted(string) bool      { return true }
func (s unavailableStore) Unavailable() error          { return s.err() }
func (s unavailableStore) Prune(func(string) bool, time.Time) (int, error) {
	return 0, s.err()
}

func (u unavailableStore) VerifiedAt(string, string, string) (time.Time, bool, error) {
	return time.Time{}, false, u.err()
}

func (unavailableStore) Layers(string) (ImageLayers, bool)   { return ImageLayers{}, false }
func (unavailableStore) LayerHolders(digest.Digest) []string { return nil }
func (s unavailableStore) NoteLayers(string, []digest.Digest, time.Time) error {
	return s.err()
}
func (s unavailableStore) RecordVerifiedPull(string, string, Credential, []digest.Digest, string, time.Time, []string) error {
	return s.err()
}
func (s unavailableStore) Vouched(string, digest.Digest, string) (bool, error) {
	return false, s.err()
}
func (s unavailableStore) ForgetLayers(func(string) bool) (int, error) { return 0, s.err() }
