package ensuretest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// MemoryStore is an in-memory ensure.RecordStore for tests of what uses
// one. It keeps nothing across processes. It is safe for concurrent use.
type MemoryStore struct {
	mu       sync.Mutex
	records  map[string]*ensure.Record
	verified map[string]time.Time // image ID, repository, credential key
	intents  map[string]string
	layers   map[string]records.ImageLayers
	vouched  map[string]bool // repository, diff_id, image ID
	next     int
	// preloaded are the images' preloaded names, sorted.
	preloaded map[string][]string
	// Fail, when set, makes every call fail with it.
	Fail error
	// FailWrites, when set, makes RecordPull fail with it: the record
	// write after a pull fails (a full disk) while intents and reads work.
	FailWrites error
}

var _ ensure.RecordStore = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: map[string]*ensure.Record{}, verified: map[string]time.Time{}, intents: map[string]string{},
		layers: map[string]records.ImageLayers{}, vouched: map[string]bool{}, preloaded: map[string][]string{}}
}

func (m *MemoryStore) Get(ref string) (*ensure.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return nil, m.Fail
	}
	r, ok := m.records[ref]
	if !ok {
		return nil, fmt.Errorf("image %s: %w", ref, ensure.ErrNotFound)
	}
	return r.DeepCopy(), nil
}

// HashAuth hashes with a fixed salt: enough for tests.
func (m *MemoryStore) HashAuth(a ensure.Auth) string {
	if a == (ensure.Auth{}) {
		return ""
	}
	h := sha256.New()
	for _, f := range []string{"memory-salt", a.Username, a.Password, a.Auth, a.IdentityToken, a.RegistryToken} {
		h.Write([]byte(strconv.Itoa(len(f)) + ":" + f))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func (m *MemoryStore) AddIntent(image string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return "", m.Fail
	}
	m.next++
	id := fmt.Sprintf("intent-%d", m.next)
	m.intents[id] = image
	return id, nil
}

func (m *MemoryStore) DropIntent(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	delete(m.intents, id)
	return nil
}

func (m *MemoryStore) Intents() ([]ensure.Intent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return nil, m.Fail
	}
	var out []ensure.Intent
	for id, img := range m.intents {
		out = append(out, ensure.Intent{ID: id, Image: img})
	}
	slices.SortFunc(out, func(a, b ensure.Intent) int { return cmpString(a.ID, b.ID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *MemoryStore) RecordPull(ref, repo string, cred ensure.Credential, intentID string, now time.Time, preloaded []string) error {
	if _, err := digest.Parse(ref); err != nil {
		return fmt.Errorf("%w: %q", records.ErrInvalidImageRef, ref)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recordPullLocked(ref, repo, cred, intentID, now, preloaded)
}

// RecordVerifiedPull is RecordPull with the image's layers and repo's word
// for each, all or nothing.
func (m *MemoryStore) RecordVerifiedPull(ref, repo string, cred ensure.Credential, diffIDs []digest.Digest, intentID string, now time.Time, preloaded []string) error {
	if _, err := digest.Parse(ref); err != nil {
		return fmt.Errorf("%w: %q", records.ErrInvalidImageRef, ref)
	}
	for _, d := range diffIDs {
		if err := d.Validate(); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.recordPullLocked(ref, repo, cred, intentID, now, preloaded); err != nil {
		return err
	}
	if _, ok := m.layers[ref]; !ok {
		m.layers[ref] = records.ImageLayers{DiffIDs: slices.Clone(diffIDs), Seen: now}
	}
	for _, d := range diffIDs {
		m.vouched[repo+"\x00"+string(d)+"\x00"+ref] = true
	}
	return nil
}

func (m *MemoryStore) Layers(ref string) (records.ImageLayers, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.layers[ref]
	return l, ok
}

func (m *MemoryStore) LayerHolders(d digest.Digest) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for ref, l := range m.layers {
		if slices.Contains(l.DiffIDs, d) {
			out = append(out, ref)
		}
	}
	slices.Sort(out)
	return out
}

func (m *MemoryStore) NoteLayers(ref string, diffIDs []digest.Digest, seen time.Time) error {
	if _, err := digest.Parse(ref); err != nil {
		return fmt.Errorf("%w: %q", records.ErrInvalidImageRef, ref)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	if _, ok := m.layers[ref]; !ok {
		m.layers[ref] = records.ImageLayers{DiffIDs: slices.Clone(diffIDs), Seen: seen}
	}
	return nil
}

func (m *MemoryStore) Vouched(repo string, d digest.Digest, ref string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return false, m.Fail
	}
	prefix := repo + "\x00" + string(d) + "\x00" + ref
	for k := range m.vouched {
		if strings.HasPrefix(k, prefix) {
			return true, nil
		}
	}
	return false, nil
}

func (m *MemoryStore) ForgetLayers(keep func(string) bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return 0, m.Fail
	}
	n := 0
	for ref := range m.layers {
		if _, rec := m.records[ref]; !rec && !keep(ref) {
			delete(m.layers, ref)
			n++
		}
	}
	return n, nil
}

// forgetVouched drops the words ref's pulls gave; m.mu is held.
func (m *MemoryStore) forgetVouched(ref string) {
	for k := range m.vouched {
		if strings.HasSuffix(k, "\x00"+ref) {
			delete(m.vouched, k)
		}
	}
}

// recordPullLocked is RecordPull; m.mu is held.
func (m *MemoryStore) recordPullLocked(ref, repo string, cred ensure.Credential, intentID string, now time.Time, preloaded []string) error {
	if m.Fail != nil {
		return m.Fail
	}
	if m.FailWrites != nil {
		return m.FailWrites
	}
	r := m.records[ref]
	if r == nil {
		r = &ensure.Record{ImageRef: ref, CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{}}
		m.records[ref] = r
		var names []string
		for _, n := range preloaded {
			if key, ok := records.PreloadedName(n); ok && !slices.Contains(names, key) {
				names = append(names, key)
			}
		}
		if len(names) > 0 {
			slices.Sort(names)
			m.preloaded[ref] = names
		}
	}
	records.MergeCredential(r, repo, cred)
	r.LastUpdatedTime = metav1.NewTime(now)
	for _, k := range records.CredentialKeys(cred) {
		m.verified[ref+"\x00"+repo+"\x00"+k] = now
	}
	delete(m.intents, intentID)
	return nil
}

func (m *MemoryStore) VerifiedAt(ref, repo, key string) (time.Time, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return time.Time{}, false, m.Fail
	}
	t, ok := m.verified[ref+"\x00"+repo+"\x00"+key]
	return t, ok, nil
}

// Preloaded returns ref's preloaded names.
func (m *MemoryStore) Preloaded(ref string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.preloaded[ref]
}

// forgetVerified drops ref's verification times and preloaded names; m.mu
// is held.
func (m *MemoryStore) forgetVerified(ref string) {
	delete(m.preloaded, ref)
	for k := range m.verified {
		if strings.HasPrefix(k, ref+"\x00") {
			delete(m.verified, k)
		}
	}
}

func (m *MemoryStore) Forget(ref string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return false, m.Fail
	}
	_, ok := m.records[ref]
	delete(m.records, ref)
	m.forgetVerified(ref)
	m.forgetVouched(ref)
	return ok, nil
}

func (m *MemoryStore) Counts() (int, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return 0, 0, m.Fail
	}
	return len(m.records), len(m.intents), nil
}

func (m *MemoryStore) Prune(present func(string) bool, until time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return 0, m.Fail
	}
	n := 0
	for ref, r := range m.records {
		if !present(ref) && r.LastUpdatedTime.Time.Before(until) {
			delete(m.records, ref)
			m.forgetVerified(ref)
			m.forgetVouched(ref)
			n++
		}
	}
	return n, nil
}

func (m *MemoryStore) Restricted(repo string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.records {
		if c, ok := r.CredentialMapping[repo]; ok && !c.NodePodsAccessible {
			return true
		}
	}
	return false
}
