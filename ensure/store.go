package ensure

import (
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	digest "github.com/opencontainers/go-digest"
)

// RecordStore is what the guard needs of the database, its two sides
// apart; *records.Store is the real one, ensuretest.MemoryStore a fake
// that passes the same conformance suite.
type RecordStore interface {
	RecordReader
	RecordWriter
}

// RecordReader is the database as the decisions read it: what is recorded
// of an image, of a repository, of a layer. What runs on every CRI call
// (Preloaded, Restricted, Layers, LayerHolders) is memory only.
type RecordReader interface {
	// Get returns the record of an image ID, or an error wrapping
	// ErrNotFound.
	Get(imageRef string) (*Record, error)
	// HashAuth returns the salted hash of a request's credential, "" for none.
	HashAuth(Auth) string
	// Intents lists the intents.
	Intents() ([]Intent, error)
	// Preloaded returns the names imageRef was listed under before its
	// first recorded pull (records.PreloadedName forms, sorted), nil when
	// none. It must be cheap (memory only): it runs on ImageStatus and
	// CreateContainer. It may miss a name (the name then needs
	// verification), never invent one.
	Preloaded(imageRef string) []string
	// Counts returns the numbers of records and intents.
	Counts() (records, intents int, err error)
	// VerifiedAt returns when the credential named key
	// (records.CredentialKeys) was last verified for imageRef as repo;
	// false when no time is kept.
	VerifiedAt(imageRef, repo, key string) (time.Time, bool, error)
	// Restricted reports whether some record has a mapping for repo that is
	// not accessible to every pod. It may err towards true, never towards
	// false. It must be cheap: it runs on every ImageStatus.
	Restricted(repo string) bool
	// Layers returns what is known of an image's layers; false for nothing.
	// Which images hold a layer is how a runtime shares it (by diff_id).
	Layers(imageRef string) (ImageLayers, bool)
	// LayerHolders returns the images known to hold the layer.
	LayerHolders(diffID digest.Digest) []string
	// Vouched reports whether repo vouched for the layer in the verified
	// pull of imageRef ("": any image) that still has its record.
	Vouched(repo string, diffID digest.Digest, imageRef string) (bool, error)
}

// RecordWriter is what a pull, its end, a removal and the clean-up write:
// each write is durable (fsynced) before it returns, and a pull's record
// goes with its intent's removal in one transaction.
type RecordWriter interface {
	// AddIntent durably notes a pull about to start and returns its ID.
	AddIntent(image string) (string, error)
	// DropIntent removes an intent.
	DropIntent(id string) error
	// RecordPull adds cred for repo to imageRef's record and drops the
	// intent, atomically and durably. When imageRef had no record,
	// preloaded (names the runtime listed the image under before the pull)
	// become its preloaded names in the same write; else they are ignored.
	RecordPull(imageRef, repo string, cred Credential, intentID string, now time.Time, preloaded []string) error
	// RecordVerifiedPull is RecordPull for a pull whose every layer repo
	// vouched for: it also keeps the image's layers and repo's word for
	// each, in the same transaction (and preloaded, as RecordPull).
	RecordVerifiedPull(imageRef, repo string, cred Credential, diffIDs []digest.Digest, intentID string, now time.Time, preloaded []string) error
	// NoteLayers keeps an image's layers, first seen at seen, unless they
	// are known already.
	NoteLayers(imageRef string, diffIDs []digest.Digest, seen time.Time) error
	// Forget deletes a record and reports whether there was one.
	Forget(imageRef string) (bool, error)
	// Prune deletes the records of images not present, last updated before until.
	Prune(present func(imageRef string) bool, until time.Time) (int, error)
	// ForgetLayers drops the layers of images keep refuses that have no
	// record.
	ForgetLayers(keep func(imageRef string) bool) (int, error)
}

var _ RecordStore = (*records.Store)(nil)
