package records

import (
	"encoding/json"
	"maps"
	"slices"
	"sync"

	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// PreloadedRecord is the kubelet's third record kind, ImagePreloadedRecord
// (the upstream change https://github.com/kubernetes/kubernetes/pull/139156,
// which fixes https://github.com/kubernetes/kubernetes/issues/138175): an
// image and the names it was observed under while it was preloaded. k8s.io/kubelet has no such type
// yet, so it is declared here with the JSON of the kubelet's own files in
// that change (its testdata/observed-preloaded): kind ImagePreloadedRecord
// of kubelet.config.k8s.io/v1beta1, lastUpdatedTime, imageRef,
// observedImages.
//
// The keys of ObservedImages are where the proxy is finer than the
// kubelet. The kubelet keys them by repository (the pod's image with its
// tag and digest trimmed, as credentialMapping), written when a pod asks
// for an image that has no pulled record, and forgets a repository once it
// pulls it with credentials. The proxy keys them by the full names the
// runtime listed the image under before its first recorded pull
// (PreloadedName: repository and tag, or repository and digest), so that
// the image stays free by those names while another tag of the same
// repository, pulled with credentials, stays its puller's. A bare
// repository key matches no name here; kubeletrecords converts between the
// two.
type PreloadedRecord struct {
	metav1.TypeMeta `json:",inline"`
	LastUpdatedTime metav1.Time               `json:"lastUpdatedTime"`
	ImageRef        string                    `json:"imageRef"`
	ObservedImages  map[string]PreloadedImage `json:"observedImages"`
}

// PreloadedImage is what is kept of an observed name: nothing, as in the
// kubelet's files, where every value is {}. (Whether the type under review
// gets fields is a guess away; none is read or written.)
type PreloadedImage struct{}

// Names returns the record's observed names, sorted.
func (r *PreloadedRecord) Names() []string {
	return slices.Sorted(maps.Keys(r.ObservedImages))
}

// PreloadedName is the key of name in a PreloadedRecord: the name as the
// runtime lists and resolves it (imageref.Name.Lookup), and false for an
// image ID or what does not parse.
func PreloadedName(name string) (string, bool) {
	n := imageref.Parse(name)
	return n.Lookup(), n.OK
}

// preloadedBucket may be nil in a read-only open of a file older than
// version 5.
func preloadedBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketPreloaded) }

func decodePreloaded(key, data []byte) (*PreloadedRecord, error) {
	r := &PreloadedRecord{}
	if err := decodeKeyed("preloaded record", key, data, r, &r.ImageRef); err != nil {
		return nil, err
	}
	return r, nil
}

func encodePreloaded(r *PreloadedRecord) ([]byte, error) {
	r.APIVersion, r.Kind = kubeletconfigv1beta1.SchemeGroupVersion.String(), "ImagePreloadedRecord"
	return json.Marshal(r)
}

// addPreloaded merges names (each a PreloadedName, or dropped) into the
// preloaded record of imageRef in tx and returns the record's names after
// it, or nil when nothing was added. A stored record that does not decode
// is replaced: the names it held cannot be read anyway.
func addPreloaded(tx *bolt.Tx, imageRef string, names []string, now metav1.Time) ([]string, error) {
	pb := preloadedBucket(tx)
	if pb == nil || len(names) == 0 {
		return nil, nil
	}
	r := &PreloadedRecord{ImageRef: imageRef}
	if v := pb.Get([]byte(imageRef)); v != nil {
		if have, err := decodePreloaded([]byte(imageRef), v); err == nil {
			r = have
		}
	}
	if r.ObservedImages == nil {
		r.ObservedImages = map[string]PreloadedImage{}
	}
	added := false
	for _, n := range names {
		if key, ok := PreloadedName(n); ok {
			if _, have := r.ObservedImages[key]; !have {
				r.ObservedImages[key] = PreloadedImage{}
				added = true
			}
		}
	}
	if !added {
		return nil, nil
	}
	r.LastUpdatedTime = now
	data, err := encodePreloaded(r)
	if err != nil {
		return nil, err
	}
	return r.Names(), pb.Put([]byte(imageRef), data)
}

// delPreloaded deletes imageRef's preloaded record, with its record.
func delPreloaded(tx *bolt.Tx, imageRef []byte) error {
	if pb := preloadedBucket(tx); pb != nil {
		return pb.Delete(imageRef)
	}
	return nil
}

// preloadedIndex is the preloaded bucket in memory: image ID -> its
// preloaded names, sorted. ImageStatus and CreateContainer read it, never
// the file, and decode nothing. It holds only images that were on the node
// before a pull through the proxy recorded them: few. A name it lacks
// needs verification: missing one is the safe error.
type preloadedIndex struct {
	mu sync.RWMutex
	m  map[string][]string
}

func (x *preloadedIndex) load(tx *bolt.Tx) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.m = map[string][]string{}
	pb := preloadedBucket(tx)
	if pb == nil {
		return nil
	}
	return pb.ForEach(func(k, v []byte) error {
		// One that does not decode holds no name: those need verification.
		if r, err := decodePreloaded(k, v); err == nil && len(r.ObservedImages) > 0 {
			x.m[string(k)] = r.Names()
		}
		return nil
	})
}

// names returns imageRef's preloaded names; shared: never change them.
func (x *preloadedIndex) names(imageRef string) []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.m[imageRef]
}

// set applies a committed change: imageRef's names are now names (nil:
// none).
func (x *preloadedIndex) set(imageRef string, names []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(names) == 0 {
		delete(x.m, imageRef)
		return
	}
	x.m[imageRef] = names
}

// Preloaded returns the names imageRef was listed under, preloaded, before
// the proxy first recorded a pull of it (PreloadedName forms, sorted); nil
// when none. It reads memory only. The slice is shared: do not change it.
func (s *Store) Preloaded(imageRef string) []string { return s.preloaded.names(imageRef) }

// PreloadedRecords returns every preloaded record that decodes, and the
// keys of those that do not.
func (s *Store) PreloadedRecords() ([]*PreloadedRecord, []string, error) {
	var out []*PreloadedRecord
	var bad []string
	err := s.db.View(func(tx *bolt.Tx) error {
		pb := preloadedBucket(tx)
		if pb == nil {
			return nil
		}
		return pb.ForEach(func(k, v []byte) error {
			r, err := decodePreloaded(k, v)
			if err != nil {
				bad = append(bad, string(k))
				return nil
			}
			out = append(out, r)
			return nil
		})
	})
	return out, bad, err
}

// putPreloaded merges recs into the preloaded records of tx, each only
// beside a record of its image (a preloaded record belongs to a record:
// an image with none is preloaded by every name anyway), and returns the
// names of those it changed.
func putPreloaded(tx *bolt.Tx, recs []*PreloadedRecord) (map[string][]string, error) {
	changed := map[string][]string{}
	for _, r := range recs {
		if recordsBucket(tx).Get([]byte(r.ImageRef)) == nil {
			continue
		}
		names, err := addPreloaded(tx, r.ImageRef, r.Names(), r.LastUpdatedTime)
		if err != nil {
			return nil, err
		}
		if names != nil {
			changed[r.ImageRef] = names
		}
	}
	return changed, nil
}
