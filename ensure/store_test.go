package ensure_test

import (
	"path/filepath"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

func openTestStore(t *testing.T) *ensure.Store {
	t.Helper()
	s, err := ensure.Open(filepath.Join(t.TempDir(), "ensure.db"), ensure.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	ensuretest.StoreConformance(t, func(t *testing.T) ensure.RecordStore { return openTestStore(t) })
}

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	ensuretest.StoreConformance(t, func(t *testing.T) ensure.RecordStore { return ensuretest.NewMemoryStore() })
}
