package kubeletrecords

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1alpha1 "k8s.io/kubelet/config/v1alpha1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	kjson "sigs.k8s.io/json"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// The kubelet's directory names under <root>/image_manager.
const (
	PulledDir  = "pulled"
	PullingDir = "pulling"
)

// Record is the kubelet's ImagePulledRecord, as the proxy stores it too.
type Record = kubeletconfigv1beta1.ImagePulledRecord

// FileName is the kubelet's file name for key: sha256-<hex sha256(key)>.
func FileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// WriteReport says what Write carried and what it could not.
type WriteReport struct {
	Records, Intents int
	// Preloaded preloaded records were written (observed-preloaded);
	// PreloadedLeftOut repositories of them were not: the image was pulled
	// as them too (forKubeletPreloaded), and the kubelet keys by
	// repository.
	Preloaded, PreloadedLeftOut int
	// SecretsByCoordinates were written with their coordinates and no hash.
	SecretsByCoordinates int
	// HashOnlySecrets were known to the proxy by their salted hash alone,
	// and not written: their pods verify again under the kubelet.
	HashOnlySecrets int
}

// InRuntimeForm rewrites the image IDs of recs and pre as the runtime
// writes them (id): the kubelet keys a record, and names its file, by the
// image ref the runtime answered, bare hex on CRI-O; the proxy keeps the
// canonical sha256:<hex>.
func InRuntimeForm(recs []*Record, pre []*PreloadedRecord, id func(string) string) {
	for _, r := range recs {
		r.ImageRef = id(r.ImageRef)
	}
	for _, p := range pre {
		p.ImageRef = id(p.ImageRef)
	}
}

// Write writes recs, the preloaded records pre (of recs' images) and the
// intents' images into dir in the kubelet's layout, each file through a
// synced temporary file and a rename; a record the kubelet already has
// there is merged with (Merge, and the union of the observed repositories
// for a preloaded one), and one that does not decode is an error, not
// overwritten. It does not change recs or pre.
func Write(dir string, recs []*Record, pre []*PreloadedRecord, intents []string) (WriteReport, error) {
	var rep WriteReport
	for _, sub := range []string{PulledDir, PullingDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return rep, err
		}
	}
	for _, r := range recs {
		out := forKubelet(r, &rep)
		path := filepath.Join(dir, PulledDir, FileName(r.ImageRef))
		// A record the kubelet already has is merged, not replaced: its
		// own entries, hashes included, stay.
		if data, err := os.ReadFile(path); err == nil {
			have, err := DecodeRecord(data)
			if err != nil {
				return rep, fmt.Errorf("%s: %w (not overwritten)", path, err)
			}
			if have.ImageRef != r.ImageRef {
				return rep, fmt.Errorf("%s: holds image %q (not overwritten)", path, have.ImageRef)
			}
			Merge(have, out)
			out = have
		} else if !errors.Is(err, os.ErrNotExist) {
			return rep, err
		}
		if err := writeJSON(path, out); err != nil {
			return rep, err
		}
		rep.Records++
	}
	for _, image := range intents {
		in := &kubeletconfigv1beta1.ImagePullIntent{Image: image}
		in.APIVersion, in.Kind = kubeletconfigv1beta1.SchemeGroupVersion.String(), "ImagePullIntent"
		if err := writeJSON(filepath.Join(dir, PullingDir, FileName(image)), in); err != nil {
			return rep, err
		}
		rep.Intents++
	}
	if err := writePreloaded(dir, recs, pre, &rep); err != nil {
		return rep, err
	}
	return rep, syncDir(dir)
}

// Merge adds src's credentials to dst's (the same image): every
// repository of either, the union of their secrets (one per coordinates,
// dst's entry kept, hash and all; hash-only ones by hash) and service
// accounts, either's nodePodsAccessible, and the later update time.
func Merge(dst, src *Record) {
	if dst.CredentialMapping == nil {
		dst.CredentialMapping = map[string]kubeletconfigv1beta1.ImagePullCredentials{}
	}
	for repo, c := range src.CredentialMapping {
		d := dst.CredentialMapping[repo]
		d.NodePodsAccessible = d.NodePodsAccessible || c.NodePodsAccessible
		for _, s := range c.KubernetesSecrets {
			if !slices.ContainsFunc(d.KubernetesSecrets, func(have kubeletconfigv1beta1.ImagePullSecret) bool { return sameSecret(have, s) }) {
				d.KubernetesSecrets = append(d.KubernetesSecrets, s)
			}
		}
		for _, sa := range c.KubernetesServiceAccounts {
			if !slices.Contains(d.KubernetesServiceAccounts, sa) {
				d.KubernetesServiceAccounts = append(d.KubernetesServiceAccounts, sa)
			}
		}
		dst.CredentialMapping[repo] = d
	}
	if src.LastUpdatedTime.After(dst.LastUpdatedTime.Time) {
		dst.LastUpdatedTime = src.LastUpdatedTime
	}
}

func sameSecret(a, b kubeletconfigv1beta1.ImagePullSecret) bool {
	if a.UID != "" || b.UID != "" {
		return records.SameSecret(a, b)
	}
	return a.CredentialHash == b.CredentialHash
}

// forKubelet is r as the kubelet may read it: secrets by their coordinates
// with no hash, hash-only secrets left out.
func forKubelet(r *Record, rep *WriteReport) *Record {
	out := &Record{LastUpdatedTime: r.LastUpdatedTime, ImageRef: r.ImageRef, CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{}}
	out.APIVersion, out.Kind = kubeletconfigv1beta1.SchemeGroupVersion.String(), "ImagePulledRecord"
	for repo, c := range r.CredentialMapping {
		k := kubeletconfigv1beta1.ImagePullCredentials{NodePodsAccessible: c.NodePodsAccessible,
			KubernetesServiceAccounts: append([]kubeletconfigv1beta1.ImagePullServiceAccount(nil), c.KubernetesServiceAccounts...)}
		for _, s := range c.KubernetesSecrets {
			if s.UID == "" || s.Namespace == "" || s.Name == "" {
				rep.HashOnlySecrets++
				continue
			}
			k.KubernetesSecrets = append(k.KubernetesSecrets, kubeletconfigv1beta1.ImagePullSecret{UID: s.UID, Namespace: s.Namespace, Name: s.Name})
			rep.SecretsByCoordinates++
		}
		out.CredentialMapping[repo] = k
	}
	return out
}

func writeJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

func syncDir(dir string) error {
	for _, d := range []string{filepath.Join(dir, PulledDir), filepath.Join(dir, PullingDir)} {
		if err := syncOne(d); err != nil {
			return err
		}
	}
	return nil
}

// syncOne makes a directory's entries durable.
func syncOne(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	return err
}

// ReadReport says what Read found and what it could not carry.
type ReadReport struct {
	Records, Intents int
	// SecretsNotCarried are the kubelet's secret entries, left out: their
	// hashes cannot be carried, and their pods verify again.
	SecretsNotCarried int
	// Skipped are files the kubelet skips too (*.tmp, other names).
	Skipped int
}

// Read reads the kubelet's records and intents under dir (its
// image_manager directory). A missing pulled or pulling directory is
// empty; a file that cannot be decoded, or whose key does not hash to its
// name, is an error naming it, and nothing is returned.
func Read(dir string) ([]*Record, []string, ReadReport, error) {
	var rep ReadReport
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, rep, err
	}
	var recs []*Record
	err := eachFile(filepath.Join(dir, PulledDir), &rep, func(name string, data []byte) error {
		r, err := DecodeRecord(data)
		if err != nil {
			return err
		}
		if FileName(r.ImageRef) != name {
			return fmt.Errorf("holds image %q, whose file would be %s", r.ImageRef, FileName(r.ImageRef))
		}
		for repo, c := range r.CredentialMapping {
			rep.SecretsNotCarried += len(c.KubernetesSecrets)
			c.KubernetesSecrets = nil
			r.CredentialMapping[repo] = c
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return nil, nil, rep, err
	}
	var intents []string
	err = eachFile(filepath.Join(dir, PullingDir), &rep, func(name string, data []byte) error {
		image, err := DecodeIntent(data)
		if err != nil {
			return err
		}
		if FileName(image) != name {
			return fmt.Errorf("holds image %q, whose file would be %s", image, FileName(image))
		}
		intents = append(intents, image)
		return nil
	})
	if err != nil {
		return nil, nil, rep, err
	}
	rep.Records, rep.Intents = len(recs), len(intents)
	return recs, intents, rep, nil
}

func eachFile(dir string, rep *ReadReport, f func(name string, data []byte) error) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasSuffix(name, ".tmp") || !strings.HasPrefix(name, "sha256-") {
			rep.Skipped++
			continue
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := f(name, data); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// versions the kubelet has written its records in; the fields of both are
// the same.
var versions = map[string]bool{
	kubeletconfigv1beta1.SchemeGroupVersion.String():  true,
	kubeletconfigv1alpha1.SchemeGroupVersion.String(): true,
}

// decodeStrict decodes data into v strictly (unknown or duplicate fields
// are errors, as in the kubelet's codec) after checking its kind and
// version.
func decodeStrict(data []byte, kind string, v any) error {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(data, &tm); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if tm.Kind != kind || !versions[tm.APIVersion] {
		return fmt.Errorf("is %s %q, want %s of kubelet.config.k8s.io/v1beta1 or v1alpha1", orNone(tm.Kind), tm.APIVersion, kind)
	}
	strict, err := kjson.UnmarshalStrict(data, v)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return errors.Join(strict...)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "no kind"
	}
	return "a " + s
}

// DecodeRecord decodes one record file.
func DecodeRecord(data []byte) (*Record, error) {
	r := &Record{}
	if err := decodeStrict(data, "ImagePulledRecord", r); err != nil {
		return nil, err
	}
	if r.ImageRef == "" {
		return nil, errors.New("no imageRef")
	}
	r.APIVersion = kubeletconfigv1beta1.SchemeGroupVersion.String()
	return r, nil
}

// DecodeIntent decodes one intent file and returns its image.
func DecodeIntent(data []byte) (string, error) {
	var in kubeletconfigv1beta1.ImagePullIntent
	if err := decodeStrict(data, "ImagePullIntent", &in); err != nil {
		return "", err
	}
	if in.Image == "" {
		return "", errors.New("no image")
	}
	return in.Image, nil
}

// Store is what Import writes into: the proxy's records database.
type Store interface {
	Get(imageRef string) (*Record, error)
	PutRecordsPreloaded([]*Record, []*PreloadedRecord) error
	AddIntent(image string) (string, error)
}

// ErrRepositoriesUnknown is Import's error when a record names no
// repository and the runtime cannot say which its image is listed under.
var ErrRepositoriesUnknown = errors.New("the repositories of images the kubelet recorded without one cannot be told")

// ImportReport says what Import did.
type ImportReport struct {
	// Merged records were merged with the database's own.
	Merged int
	// Unmapped records named no repository (the kubelet's settled pull
	// intents); Repositories were given to them, with no credential.
	Unmapped, Repositories int
	// NoRepository of them still name none: their image is not on the
	// node, or is listed under no name (a lookup by ID verifies).
	NoRepository int
	// PreloadedNames are the names the kubelet's preloaded records gave
	// their images (fromKubeletPreloaded); PreloadedLeftOut repositories of
	// them were not carried: the image was pulled as them, is not on the
	// node or has no record, or the runtime could not be asked
	// (PreloadedUnasked, its error). What is not carried needs
	// verification.
	PreloadedNames, PreloadedLeftOut int
	PreloadedUnasked                 error
}

// Import adds recs (as Read returns them) to s, merged with the records s
// already has (Merge), with the names of the kubelet's preloaded records
// pre (ReadPreloaded; fromKubeletPreloaded), in one transaction, then the
// intents, which the daemon settles at its start as its own. A record of s
// that cannot be read is an error: nothing is imported.
//
// A record with no credential mapping, or an empty one, is the kubelet's
// "pulled, every pod must verify" (its settled pull intents): the kubelet
// verifies any use of an image it has a record of, whatever the
// repository, while the proxy decides per repository. Such a record is
// given, with no credential, every repository node (the runtime's images)
// lists its image under (records.MarkPulled), so that no name of the image
// passes for a preloaded one. node is asked at most once: for such
// records, and for the names of the preloaded records' repositories; when
// it fails, an import with such records imports nothing
// (ErrRepositoriesUnknown), one with preloaded records only leaves their
// names out (they need verification).
func Import(s Store, recs []*Record, pre []*PreloadedRecord, intents []string, node func() ([]records.Image, error)) (rep ImportReport, err error) {
	// The database keeps image IDs in one form: a kubelet on CRI-O writes
	// them as bare hex.
	for _, r := range recs {
		r.ImageRef = imageref.CanonicalID(r.ImageRef)
	}
	for _, p := range pre {
		p.ImageRef = imageref.CanonicalID(p.ImageRef)
	}
	var images []records.Image
	var nodeErr error
	asked := false
	ask := func() ([]records.Image, error) {
		if !asked {
			asked = true
			images, nodeErr = node()
		}
		return images, nodeErr
	}
	// The repositories the kubelet pulled each image as, before the
	// unmapped records get every repository of theirs.
	pulledAs := map[string]map[string]bool{}
	for _, r := range recs {
		pulledAs[r.ImageRef] = map[string]bool{}
		for repo := range r.CredentialMapping {
			pulledAs[r.ImageRef][repo] = true
		}
	}
	if err := markUnmapped(recs, ask, &rep); err != nil {
		return rep, err
	}
	out := make([]*Record, 0, len(recs))
	for _, r := range recs {
		have, err := s.Get(r.ImageRef)
		switch {
		case errors.Is(err, records.ErrNotFound):
			out = append(out, r)
		case err != nil:
			return rep, fmt.Errorf("the database's record of %s: %w (nothing imported)", r.ImageRef, err)
		default:
			m := have.DeepCopy()
			Merge(m, r)
			out = append(out, m)
			rep.Merged++
		}
	}
	names, err := preloadedNames(s, pre, pulledAs, ask, &rep)
	if err != nil {
		return rep, err
	}
	if err := s.PutRecordsPreloaded(out, names); err != nil {
		return rep, err
	}
	for _, image := range intents {
		if _, err := s.AddIntent(image); err != nil {
			return rep, fmt.Errorf("intent %s: %w", image, err)
		}
	}
	return rep, nil
}

// preloadedNames is pre by the proxy's names (fromKubeletPreloaded), for
// the images with a record, the kubelet's (pulledAs) or the database's.
func preloadedNames(s Store, pre []*PreloadedRecord, pulledAs map[string]map[string]bool, node func() ([]records.Image, error), rep *ImportReport) ([]*PreloadedRecord, error) {
	if len(pre) == 0 {
		return nil, nil
	}
	images, err := node()
	if err != nil {
		rep.PreloadedUnasked = err
		for _, p := range pre {
			rep.PreloadedLeftOut += len(p.ObservedImages)
		}
		return nil, nil
	}
	byID := make(map[string]*records.Image, len(images))
	for i := range images {
		byID[images[i].ID] = &images[i]
	}
	var out []*PreloadedRecord
	for _, p := range pre {
		have := map[string]bool{}
		r, err := s.Get(p.ImageRef)
		switch {
		case err == nil:
			for repo := range r.CredentialMapping {
				have[repo] = true
			}
		case !errors.Is(err, records.ErrNotFound):
			return nil, fmt.Errorf("the database's record of %s: %w (nothing imported)", p.ImageRef, err)
		case pulledAs[p.ImageRef] == nil:
			rep.PreloadedLeftOut += len(p.ObservedImages) // no record: preloaded by every name already
			continue
		}
		q, left := fromKubeletPreloaded(p, pulledAs[p.ImageRef], have, byID[p.ImageRef])
		rep.PreloadedLeftOut += left
		rep.PreloadedNames += len(q.ObservedImages)
		if len(q.ObservedImages) > 0 {
			out = append(out, q)
		}
	}
	return out, nil
}

// markUnmapped gives each record of recs that names no repository the
// repositories node lists its image under.
func markUnmapped(recs []*Record, node func() ([]records.Image, error), rep *ImportReport) error {
	var unmapped []*Record
	for _, r := range recs {
		if len(r.CredentialMapping) == 0 {
			unmapped = append(unmapped, r)
		}
	}
	if len(unmapped) == 0 {
		return nil
	}
	images, err := node()
	if err != nil {
		return fmt.Errorf("%w: %d record(s) name no repository (the first: %s), and the runtime could not list the names of their images: %w (nothing imported)",
			ErrRepositoriesUnknown, len(unmapped), unmapped[0].ImageRef, err)
	}
	repos := make(map[string][]string, len(images))
	for _, img := range images {
		repos[img.ID] = img.Repositories
	}
	rep.Unmapped = len(unmapped)
	for _, r := range unmapped {
		rep.Repositories += records.MarkPulled(r, repos[r.ImageRef])
		if len(r.CredentialMapping) == 0 {
			rep.NoRepository++
		}
	}
	return nil
}
