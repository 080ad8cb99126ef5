package records

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
)

// ImageLayers is what the database knows of an image's layers: their
// diff_ids, in order (the image's config, rootfs.diff_ids: what a runtime
// shares layers by), and when the proxy first learnt them (the image's
// pull through the proxy, or the first time it saw the image on the
// node). An image's ID is its config's digest, so its layers never change.
type ImageLayers struct {
	DiffIDs []digest.Digest
	Seen    time.Time
}

// encodeLayers is the layers bucket's value: the time seen (8 bytes, Unix
// nanoseconds big-endian), then the diff_ids, one per line.
func encodeLayers(l ImageLayers) []byte {
	b := encodeTime(l.Seen)
	for i, d := range l.DiffIDs {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, d...)
	}
	return b
}

func decodeLayers(v []byte) (ImageLayers, error) {
	if len(v) < 8 {
		return ImageLayers{}, fmt.Errorf("layers entry of %d bytes", len(v))
	}
	l := ImageLayers{Seen: decodeTime(v[:8])}
	if rest := v[8:]; len(rest) > 0 {
		for _, s := range strings.Split(string(rest), "\n") {
			d, err := digest.Parse(s)
			if err != nil {
				return ImageLayers{}, fmt.Errorf("layers entry: %v", err)
			}
			l.DiffIDs = append(l.DiffIDs, d)
		}
	}
	return l, nil
}

// vouchedKey is where a repository's word for a layer is kept: the
// repository, the diff_id and the image whose pull gave it, joined by NUL,
// which none contains.
func vouchedKey(repo string, diffID digest.Digest, imageRef string) []byte {
	return []byte(repo + "\x00" + string(diffID) + "\x00" + imageRef)
}

// layerIndex is the layers bucket in memory: each image's layers, and the
// images holding each layer. Loaded at open, kept with each write; it is
// what the decisions about shared content read, never the file.
type layerIndex struct {
	mu      sync.RWMutex
	images  map[string]ImageLayers
	holders map[digest.Digest][]string
}

func (x *layerIndex) load(tx *bolt.Tx) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.images, x.holders = map[string]ImageLayers{}, map[digest.Digest][]string{}
	b := layersBucket(tx)
	if b == nil {
		return nil // a read-only open of an older file
	}
	return b.ForEach(func(k, v []byte) error {
		l, err := decodeLayers(v)
		if err != nil {
			return nil // an entry that does not decode is no knowledge: the layers are learnt again
		}
		x.addLocked(string(k), l)
		return nil
	})
}

func (x *layerIndex) addLocked(ref string, l ImageLayers) {
	if _, ok := x.images[ref]; ok {
		return
	}
	x.images[ref] = l
	for _, d := range slices.Compact(slices.Sorted(slices.Values(l.DiffIDs))) {
		x.holders[d] = append(x.holders[d], ref)
	}
}

func (x *layerIndex) commit(added map[string]ImageLayers, removed []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for ref, l := range added {
		x.addLocked(ref, l)
	}
	for _, ref := range removed {
		l, ok := x.images[ref]
		if !ok {
			continue
		}
		delete(x.images, ref)
		for _, d := range l.DiffIDs {
			h := slices.DeleteFunc(x.holders[d], func(r string) bool { return r == ref })
			if len(h) == 0 {
				delete(x.holders, d)
			} else {
				x.holders[d] = h
			}
		}
	}
}

// Layers returns what the database knows of an image's layers; false
// when nothing.
func (s *Store) Layers(imageRef string) (ImageLayers, bool) {
	s.layers.mu.RLock()
	defer s.layers.mu.RUnlock()
	l, ok := s.layers.images[imageRef]
	return l, ok
}

// LayerHolders returns the images known to hold the layer diffID.
func (s *Store) LayerHolders(diffID digest.Digest) []string {
	s.layers.mu.RLock()
	defer s.layers.mu.RUnlock()
	return slices.Clone(s.layers.holders[diffID])
}

// NoteLayers records the layers of an image the proxy learnt them of (the
// runtime's copy of its config), seen at seen, unless it knows them
// already: the first sighting stands.
func (s *Store) NoteLayers(imageRef string, diffIDs []digest.Digest, seen time.Time) error {
	if err := validImageRef(imageRef); err != nil {
		return err
	}
	if _, ok := s.Layers(imageRef); ok {
		return nil
	}
	added := map[string]ImageLayers{}
	err := s.db.Update(func(tx *bolt.Tx) error {
		l, err := putLayers(tx, imageRef, diffIDs, seen)
		if err == nil && l != nil {
			added[imageRef] = *l
		}
		return err
	})
	if err == nil {
		s.layers.commit(added, nil)
	}
	return err
}

// putLayers writes imageRef's layers unless the file has them; it returns
// what it wrote, nil for nothing.
func putLayers(tx *bolt.Tx, imageRef string, diffIDs []digest.Digest, seen time.Time) (*ImageLayers, error) {
	b := layersBucket(tx)
	if b.Get([]byte(imageRef)) != nil {
		return nil, nil
	}
	l := ImageLayers{DiffIDs: slices.Clone(diffIDs), Seen: seen}
	return &l, b.Put([]byte(imageRef), encodeLayers(l))
}

// RecordVerifiedPull is RecordPull for a pull whose image's layers the
// registry vouched for as repo: every layer of diffIDs was either
// supplied by repo (fetched by the runtime from it, or proven by its bytes
// there), or already vouched for there. It writes, in the record's
// transaction, the image's layers (if new) and repo's word for each, so
// that a later pull of another image of repo sharing a layer needs no
// proof of it. preloaded are as RecordPull's.
func (s *Store) RecordVerifiedPull(imageRef, repo string, cred Credential, diffIDs []digest.Digest, intentID string, now time.Time, preloaded []string) error {
	for _, d := range diffIDs {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("layer of %s: %w", imageRef, err)
		}
	}
	added := map[string]ImageLayers{}
	err := s.recordPull(imageRef, repo, cred, intentID, now, preloaded, func(tx *bolt.Tx) error {
		l, err := putLayers(tx, imageRef, diffIDs, now)
		if err != nil {
			return err
		}
		if l != nil {
			added[imageRef] = *l
		}
		vb := vouchedBucket(tx)
		for _, d := range diffIDs {
			if err := vb.Put(vouchedKey(repo, d, imageRef), encodeTime(now)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		s.layers.commit(added, nil)
	}
	return err
}

// Vouched reports whether repo vouched for the layer diffID in a verified
// pull of imageRef ("": of any image) that still has its record: the
// registry supplied it, or proved it by its bytes, there.
func (s *Store) Vouched(repo string, diffID digest.Digest, imageRef string) (bool, error) {
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		vb := vouchedBucket(tx)
		if vb == nil {
			return nil
		}
		prefix := vouchedKey(repo, diffID, imageRef)
		k, _ := vb.Cursor().Seek(prefix)
		found = k != nil && bytes.HasPrefix(k, prefix)
		return nil
	})
	return found, err
}

// delVouched deletes the words repositories gave for the layers of
// imageRef's pulls: with its record.
func delVouched(tx *bolt.Tx, imageRef []byte, rec *Record) error {
	vb := vouchedBucket(tx)
	if vb == nil || rec == nil {
		return nil
	}
	v := layersBucket(tx).Get(imageRef)
	if v == nil {
		return nil
	}
	l, err := decodeLayers(v)
	if err != nil {
		return nil
	}
	for repo := range rec.CredentialMapping {
		for _, d := range l.DiffIDs {
			if err := vb.Delete(vouchedKey(repo, d, string(imageRef))); err != nil {
				return err
			}
		}
	}
	return nil
}

// ForgetLayers drops what the database knows of the layers of images for
// which keep returns false (gone from the node, and with no record), and
// reports how many: garbage collection.
func (s *Store) ForgetLayers(keep func(imageRef string) bool) (int, error) {
	var doomed []string
	s.layers.mu.RLock()
	for ref := range s.layers.images {
		if !keep(ref) {
			doomed = append(doomed, ref)
		}
	}
	s.layers.mu.RUnlock()
	if len(doomed) == 0 {
		return 0, nil
	}
	var gone []string
	err := s.db.Update(func(tx *bolt.Tx) error {
		gone = gone[:0]
		b := layersBucket(tx)
		for _, ref := range doomed {
			if recordsBucket(tx).Get([]byte(ref)) != nil {
				continue // kept while a record names the image: its pulls' words need them
			}
			if err := b.Delete([]byte(ref)); err != nil {
				return err
			}
			gone = append(gone, ref)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.layers.commit(nil, gone)
	return len(gone), nil
}

// addLayers (version 4) adds the buckets of images' layers and of the
// words repositories gave for them. Both start empty: the daemon learns
// the layers of the node's images from the runtime at its start.
func addLayers(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketLayers, bucketVouched} {
		if _, err := createBucket(tx, bucketSchema, b); err != nil {
			return err
		}
	}
	return nil
}
