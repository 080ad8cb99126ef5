package ensure_test

import (
	"path/filepath"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

func openTestStore(t *testing.T) *records.Store {
	t.Helper()
	s, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
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
