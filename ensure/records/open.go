package records

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

var (
	// ErrLocked is Open's error when another process holds the file (a
	// running daemon holds it for as long as it runs).
	ErrLocked = errors.New("locked by another process")
	// ErrNotADatabase is Open's error for a file that exists but is not a
	// whole ensure database: empty, truncated, or without the ensure
	// layout. It is never made into a new one: a new database has a new
	// salt and no records, and every image pulled with credentials would
	// pass for a preloaded one.
	ErrNotADatabase = errors.New("not an ensure database")
)

// Open opens the database at path, migrating an older layout. A read-write
// open of an absent file creates it (mode 0600, its directory 0700), whole
// or not at all; an existing file that is not a whole ensure database is
// an error, and is left as it is.
func Open(path string, opts Options) (*Store, error) {
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = 2 * time.Second
	}
	s, err := open(path, opts)
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("ensure database %s: %w (is cri-image-proxy running? use its admin socket)", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("ensure database %s: %w", path, err)
	}
	return s, nil
}

func open(path string, opts Options) (*Store, error) {
	if !opts.ReadOnly {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := createIfAbsent(path, opts); err != nil {
			return nil, fmt.Errorf("creating it: %w", err)
		}
	}
	// bbolt takes a zero-length file for a new one and initialises it, and
	// a read-write open reads the freelist page wherever the meta page says
	// (past the end of a truncated file: a panic, or a fault). Check the
	// file whole, read-only, first.
	if err := checkWhole(path, opts); err != nil {
		return nil, err
	}
	db, err := openBolt(path, opts)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, path: path, pageSize: db.Info().PageSize, cache: recordCache{max: 4096, m: map[string]*Record{}}}
	if !opts.ReadOnly {
		err = db.Update(func(tx *bolt.Tx) error {
			// Only createIfAbsent makes a new layout: a file without it
			// is not ours.
			if err := hasLayout(tx); err != nil {
				return err
			}
			return initialize(tx, migrations, newSalt)
		})
	}
	if err == nil {
		err = db.View(func(tx *bolt.Tx) error {
			if err := hasLayout(tx); err != nil {
				return err
			}
			meta := metaBucket(tx)
			// A read-only open runs no migration: it must still not misread
			// a newer layout.
			if v := meta.Get(keyVersion); v != nil {
				if n, k := binary.Uvarint(v); k > 0 && int(n) > latest(migrations) {
					return fmt.Errorf("%w (version %d; this build knows up to %d)", errNewerDatabase, n, latest(migrations))
				}
			}
			s.salt = bytes.Clone(meta.Get(keySalt))
			if reposBucket(tx) == nil {
				return errors.New("no repos bucket")
			}
			if err := s.layers.load(tx); err != nil {
				return err
			}
			if err := s.preloaded.load(tx); err != nil {
				return err
			}
			return s.repos.load(tx)
		})
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// hasLayout checks that tx is an ensure database: its meta bucket and salt.
func hasLayout(tx *bolt.Tx) error {
	if meta := metaBucket(tx); meta == nil || len(meta.Get(keySalt)) != saltLen {
		return fmt.Errorf("%w (no meta bucket or salt)", ErrNotADatabase)
	}
	return nil
}

// openBolt opens an existing file with bbolt, never creating one. A panic
// of bbolt's on a damaged file is an error, the file closed (its lock
// released).
func openBolt(path string, opts Options) (db *bolt.DB, err error) {
	var file *os.File
	defer func() {
		if p := recover(); p != nil {
			if file != nil {
				file.Close()
			}
			db, err = nil, fmt.Errorf("%w: bbolt: %v", ErrNotADatabase, p)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		// Without a timeout bolt.Open blocks forever on the flock of
		// another process holding the file.
		Timeout:  opts.OpenTimeout,
		ReadOnly: opts.ReadOnly,
		// The freelist is kept on disk (bbolt's default). Without it, open
		// rebuilds it by reading every page, and with 100,000 records the
		// whole file stayed in the daemon's memory (+105 MiB RSS).
		NoFreelistSync: false,
		OpenFile: func(name string, flag int, mode os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag&^os.O_CREATE, mode)
			if err != nil {
				return nil, err
			}
			if fi, err := f.Stat(); err != nil || fi.Size() == 0 {
				f.Close()
				return nil, errEmpty(err)
			}
			file = f
			return f, nil
		},
	})
	if errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrChecksum) || errors.Is(err, bolterrors.ErrVersionMismatch) {
		err = fmt.Errorf("%w: %w", ErrNotADatabase, err)
	}
	return db, err
}

func errEmpty(statErr error) error {
	if statErr != nil {
		return statErr
	}
	return fmt.Errorf("%w: the file is empty (only an absent file is made into a new database)", ErrNotADatabase)
}

// checkWhole opens path read-only (bbolt then reads its meta pages only)
// and checks that the file holds every page its meta page counts.
func checkWhole(path string, opts Options) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return errEmpty(nil)
	}
	db, err := openBolt(path, Options{OpenTimeout: opts.OpenTimeout, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		if fi, err := os.Stat(path); err != nil {
			return err
		} else if tx.Size() > fi.Size() {
			return fmt.Errorf("%w: the file is truncated: %d bytes, its pages take %d", ErrNotADatabase, fi.Size(), tx.Size())
		}
		return nil
	})
}

// createIfAbsent makes a new database at path when there is no file there:
// initialised aside, then linked into place (never over a file that
// appeared meanwhile), so that path is never a half-made database.
func createIfAbsent(path string, opts Options) error {
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return err // nil: it exists, and is checked as any other
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	db, err := bolt.Open(tmp.Name(), 0o600, &bolt.Options{Timeout: opts.OpenTimeout})
	if err != nil {
		return err
	}
	// bbolt syncs the file at its initialisation and at each commit.
	err = db.Update(func(tx *bolt.Tx) error { return initialize(tx, migrations, newSalt) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func newSalt() ([]byte, error) {
	b := make([]byte, saltLen)
	_, err := rand.Read(b)
	return b, err
}
