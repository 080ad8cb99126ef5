package records

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// RestoreReport says what Restore did.
type RestoreReport struct {
	// Kept is where the file Restore replaced now is ("" when there was
	// none).
	Kept string
	// Images present on the node that the backup did not know (as a whole,
	// or as some repository) were marked pulled with no verified
	// credential: Repositories in all; those listed under no name got a
	// record that names none (a lookup by ID verifies).
	Images, Repositories int
	// Unreadable records of the backup were left as they are: reading
	// them fails, which already means "verify".
	Unreadable int
	// Intents is how many pull intents of the database Restore replaced
	// (pulls in flight when it was last used) were carried into the
	// restored one, so that the next start settles them.
	Intents int
	// PreloadedCarried is how many preloaded records of the database
	// Restore replaced (the names images on the node had before their
	// first recorded pull) were carried into the restored one, merged with
	// its own.
	PreloadedCarried int
	// IntentsLost says why the replaced database's intents could not be
	// read ("" when they were, or there was no database), when the restore
	// went on by RestoreOptions.ForgetUnreadableIntents: an image such a
	// pull brings after the restore is not tracked.
	IntentsLost string
}

// RestoreOptions are Restore's.
type RestoreOptions struct {
	// OpenTimeout bounds the wait for another process's lock on the file.
	// Default 2s.
	OpenTimeout time.Duration
	// ForgetUnreadableIntents lets a restore replace a database whose pull
	// intents cannot be read; without it Restore refuses such a database
	// (ErrIntentsUnreadable) and changes nothing.
	ForgetUnreadableIntents bool
	// Preloaded are the layers (diff_ids) of the images the operator names
	// preloaded, by image ID: kept as on the node before anything (first
	// seen at the zero time), so that an image that came around the proxy
	// later holding one of their layers is not taken for one that brought
	// another tenant's content.
	Preloaded map[string][]digest.Digest
}

// ErrIntentsUnreadable: the database a restore would replace cannot be
// read, so the pulls it had in flight would be forgotten.
var ErrIntentsUnreadable = errors.New("the pull intents of the database it would replace cannot be read")

// Restore installs the backup at path. The backup is copied aside, opened
// (checked whole, migrated), and every image of present it does not know
// is marked there as pulled with no verified credential (MarkPulled): each
// of its repositories the backup's record lacks, or, for an image the
// backup has no record of and that is listed under no name, a record that
// names none. The pull intents of the file at path (pulls in flight when
// it was last used, whose images may still arrive) are carried into the
// copy, and so are its preloaded records of the images of present (what
// those images were listed under before their first recorded pull is a
// fact of the node, whichever backup is restored; an older backup would
// otherwise make a preloaded name need verification again). Only then is the copy renamed over path, the file it replaces
// kept beside it (Kept). A restore of an older backup thus never
// makes an image pulled since the backup pass for a preloaded one: every
// pod verifies it once. present is every image on the node except those
// the operator names preloaded.
//
// The file at path is locked as the daemon locks it for the whole
// restore: while a daemon (or a records tool) holds it, Restore fails
// with ErrLocked and changes nothing. A file at path whose intents cannot
// be read is refused (ErrIntentsUnreadable) unless
// opts.ForgetUnreadableIntents. On any error nothing is changed.
func Restore(path, backup string, present []Image, now time.Time, ropts RestoreOptions) (rep RestoreReport, err error) {
	opts := Options{OpenTimeout: ropts.OpenTimeout}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = 2 * time.Second
	}
	b, err := Open(backup, Options{ReadOnly: true, OpenTimeout: opts.OpenTimeout})
	if err != nil {
		return rep, fmt.Errorf("the backup: %w", err)
	}
	b.Close()
	if same(path, backup) {
		return rep, fmt.Errorf("the backup %s is the database itself", backup)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return rep, err
	}
	unlock, err := lockFile(path, opts.OpenTimeout)
	if err != nil {
		return rep, fmt.Errorf("ensure database %s: %w", path, err)
	}
	defer unlock()

	intents, carry, lost := currentIntents(path, dir, opts)
	if lost != "" && !ropts.ForgetUnreadableIntents {
		return rep, fmt.Errorf("%w (%s): an image a pull in flight at its last use brings later would not be tracked", ErrIntentsUnreadable, lost)
	}
	tmp, err := copyAside(backup, dir, filepath.Base(path)+".restore-*")
	if err != nil {
		return rep, fmt.Errorf("copying the backup %s beside %s: %w", backup, path, err)
	}
	defer os.Remove(tmp) // after the rename there is nothing there
	if rep, err = markUnknown(tmp, present, ropts.Preloaded, intents, carry, now, opts); err != nil {
		return rep, err
	}
	rep.IntentsLost = lost
	if _, err := os.Lstat(path); err == nil {
		if rep.Kept, err = keep(path, now); err != nil {
			return rep, fmt.Errorf("keeping %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return rep, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return rep, err
	}
	return rep, syncDir(dir)
}

// rawIntent is a pull intent as stored: its key and its encoding, carried
// whole (an undecodable one still stands for a pull).
type rawIntent struct{ key, value []byte }

// currentIntents reads the pull intents and the preloaded records of the
// database at path, through a copy (the caller holds path's lock, which a
// second open would wait on). lost says why they could not be read; ""
// also when there is no file. A preloaded record that does not decode is
// left behind: its names need verification.
func currentIntents(path, dir string, opts Options) (intents []rawIntent, preloaded []*PreloadedRecord, lost string) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, ""
	}
	cp, err := copyAside(path, dir, filepath.Base(path)+".intents-*")
	if err != nil {
		return nil, nil, err.Error()
	}
	defer os.Remove(cp)
	s, err := Open(cp, Options{ReadOnly: true, OpenTimeout: opts.OpenTimeout})
	if err != nil {
		return nil, nil, err.Error()
	}
	defer s.Close()
	err = s.db.View(func(tx *bolt.Tx) error {
		return intentsBucket(tx).ForEach(func(k, v []byte) error {
			intents = append(intents, rawIntent{key: bytes.Clone(k), value: bytes.Clone(v)})
			return nil
		})
	})
	if err != nil {
		return nil, nil, err.Error()
	}
	preloaded, _, _ = s.PreloadedRecords()
	return intents, preloaded, ""
}

// markUnknown marks, in the database at path, every image of present the
// database does not know, and merges carry, the preloaded records (names)
// of present's images, in one transaction, and adds intents.
func markUnknown(path string, present []Image, preloaded map[string][]digest.Digest, intents []rawIntent, carry []*PreloadedRecord, now time.Time, opts Options) (rep RestoreReport, err error) {
	s, err := Open(path, Options{OpenTimeout: opts.OpenTimeout})
	if err != nil {
		return rep, fmt.Errorf("the backup, copied to %s: %w", path, err)
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var changed []*Record
	for _, img := range present {
		r, err := s.Get(img.ID)
		switch {
		case errors.Is(err, ErrNotFound):
			// Unknown: a record of each repository, or naming none.
			r = &Record{ImageRef: img.ID, CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{}}
		case err != nil:
			rep.Unreadable++
			continue
		default:
			r = r.DeepCopy()
		}
		n := MarkPulled(r, img.Repositories)
		if n == 0 && err == nil {
			continue // known as every repository it is listed under
		}
		r.LastUpdatedTime.Time = now
		changed = append(changed, r)
		rep.Images++
		rep.Repositories += n
	}
	onNode := make(map[string]bool, len(present))
	for _, img := range present {
		onNode[img.ID] = true
	}
	var carried []*PreloadedRecord
	for _, p := range carry {
		if onNode[p.ImageRef] {
			carried = append(carried, p)
		}
	}
	if err := s.PutRecordsPreloaded(changed, carried); err != nil {
		return rep, fmt.Errorf("marking the images the backup does not know: %w", err)
	}
	rep.PreloadedCarried = len(carried)
	err = s.db.Update(func(tx *bolt.Tx) error {
		for ref, diffIDs := range preloaded {
			if err := validImageRef(ref); err != nil {
				return err
			}
			if err := layersBucket(tx).Put([]byte(ref), encodeLayers(ImageLayers{DiffIDs: diffIDs})); err != nil {
				return err
			}
		}
		for _, in := range intents {
			if err := put(tx, intentsBucket(tx), keyIntentsCount, in.key, in.value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("carrying the pull intents of the database it replaces: %w", err)
	}
	rep.Intents = len(intents)
	return rep, nil
}

// lockFile takes the lock bbolt takes on path (flock, exclusive), waiting
// up to timeout; an absent file needs none.
func lockFile(path string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			// Unlock before closing: a flock lasts while any copy of
			// its descriptor does, and a child this process starts holds
			// one from fork until exec, so closing alone may leave the
			// database locked for a moment after the restore.
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w (is cri-image-proxy running? stop it first)", ErrLocked)
			}
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// copyAside copies src into a new file of dir named after pattern (mode
// 0600), synced, and returns its path.
func copyAside(src, dir, pattern string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, in)
	if serr := out.Sync(); err == nil {
		err = serr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", err
	}
	return out.Name(), nil
}

// keep links path to a new name beside it, for the operator, and returns
// it: the rename that follows replaces path, not this link.
func keep(path string, now time.Time) (string, error) {
	base := path + ".before-restore-" + now.UTC().Format("20060102T150405Z")
	for i := 0; i < 100; i++ {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s.%d", base, i)
		}
		err := os.Link(path, name)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("%s and 99 more names beside it are taken", base)
}

// same reports whether two paths name the same file.
func same(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
