package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// TestTheDaemonFailsClosedOnAnEmptyOrTruncatedDatabase opens the records
// database as the daemon does (enforce): an empty or truncated file is not
// made into a new database (new salt, no records: every image pulled with
// credentials preloaded), but takes the path of a database that cannot be
// opened: the guard over ensure.UnavailableStore, its readiness check
// failing, no admin API, and the file left for the operator.
func TestTheDaemonFailsClosedOnAnEmptyOrTruncatedDatabase(t *testing.T) {
	t.Parallel()
	whole := filepath.Join(t.TempDir(), "ensure.db")
	s, err := records.Open(whole, records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var recs []*records.Record
	for i := range 300 {
		r := &records.Record{ImageRef: fmt.Sprintf("sha256:%064x", i)}
		records.MergeCredential(r, "registry.test/team/app", records.Credential{Hash: s.HashAuth(records.Auth{Username: "u", Password: "p"})})
		recs = append(recs, r)
	}
	if err := s.PutRecords(recs); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	backend, err := criproxy.Dial("unix://"+filepath.Join(t.TempDir(), "no-runtime.sock"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()

	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"an empty file", nil},
		{"a truncated file", data[:len(data)/2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := config.Default().EnsureSecretPulledImages
			e.Enabled, e.DatabasePath = true, filepath.Join(t.TempDir(), "ensure.db")
			if err := os.WriteFile(e.DatabasePath, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			checker, err := registry.New(registry.Options{HostsDir: t.TempDir(), Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			d := &daemon{log: slog.New(slog.NewTextHandler(&logs, nil)), reg: reg, backend: backend, registry: checker}
			defer d.closeAll()
			enf, err := d.enforce(context.Background(), e)
			if err != nil {
				t.Fatalf("the daemon would not start: %v", err)
			}
			if enf.admin != nil {
				t.Fatal("the file was opened as a records database: there is an admin API")
			}
			if err := enf.readyChecks[0](context.Background()); !errors.Is(err, ensure.ErrRecordsUnavailable) || !errors.Is(err, records.ErrNotADatabase) {
				t.Errorf("the readiness check says %v, want the records unavailable: not a database", err)
			}
			if !strings.Contains(logs.String(), "the records database cannot be opened") || !strings.Contains(logs.String(), e.DatabasePath) {
				t.Errorf("the log does not tell the operator:\n%s", logs.String())
			}
			if after, _ := os.ReadFile(e.DatabasePath); !bytes.Equal(after, tc.content) {
				t.Errorf("the file was changed: %d bytes, was %d", len(after), len(tc.content))
			}
		})
	}
}

// TestTheGuardIsBuiltWithWhatItNeeds: the guard gets the record expiry
// from its constructor, in force from the first decision, and is not
// built without the registry check (it would take the runtime's success
// for the registry's word).
func TestTheGuardIsBuiltWithWhatItNeeds(t *testing.T) {
	t.Parallel()
	backend, err := criproxy.Dial("unix://"+filepath.Join(t.TempDir(), "no-runtime.sock"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	e := config.Default().EnsureSecretPulledImages
	e.Enabled = true
	e.MaxRecordAge.Duration = time.Hour
	policy, err := ensurePolicy(e)
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry(), backend: backend}
	if _, err := d.newGuard(ensuretest.NewMemoryStore(), policy, e); err == nil {
		t.Fatal("a guard was built without the registry check")
	}
	if d.registry, err = registry.New(registry.Options{HostsDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	guard, err := d.newGuard(ensuretest.NewMemoryStore(), policy, e)
	if err != nil {
		t.Fatal(err)
	}
	if x := guard.Expiry(); x == nil || x.Default != time.Hour {
		t.Errorf("the guard starts with the record expiry %+v, want a default of 1h", x)
	}
}
