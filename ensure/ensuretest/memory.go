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
	// preloaded are the images' preloaded names, sorted.
	preloaded map[string][]string
	intents   map[string]string
	next      int
	// Fail, when set, makes every call fail with it.
	Fail error
	// FailWrites, when set, makes RecordPull fail with it: the record
	// write after a pull fails (a full disk) while intents and reads work.
	FailWrites error
}

var _ ensure.RecordStore = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: map[string]*ensure.Record{}, verified: map[string]time.Time{}, intents: map[string]string{}, preloaded: map[string][]string{}}
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
