package ensure_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

func TestStatusCarriesTheRecordsCondition(t *testing.T) {
	t.Parallel()
	runtimeStatus := func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
		return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
			{Type: "RuntimeReady", Status: true}, {Type: "NetworkReady", Status: true},
		}}, Info: map[string]string{"config": "{}"}}, nil
	}
	for _, tt := range []struct {
		name       string
		store      ensure.RecordStore
		wantStatus bool
		wantReason string
	}{
		{"an open database: the condition is true", ensuretest.NewMemoryStore(), true, "RecordsDatabaseOpen"},
		{"a database that could not be opened: false, without its cause", ensure.UnavailableStore(errors.New("page 7 out of range")), false, "RecordsDatabaseUnavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
			g, err := ensure.NewGuard(tt.store, p, ensure.CRIRuntime(newFakeNode(), newFakeNode()), ensure.GuardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := g.Status(context.Background(), &runtimeapi.StatusRequest{Verbose: true}, runtimeStatus)
			if err != nil {
				t.Fatal(err)
			}
			cs := resp.GetStatus().GetConditions()
			if len(cs) != 3 || cs[0].Type != "RuntimeReady" || cs[1].Type != "NetworkReady" || resp.Info["config"] != "{}" {
				t.Fatalf("the runtime's answer changed: %v", resp)
			}
			c := cs[2]
			if c.Type != ensure.RecordsCondition || c.Status != tt.wantStatus || c.Reason != tt.wantReason {
				t.Errorf("condition %v, want %s %v %s", c, ensure.RecordsCondition, tt.wantStatus, tt.wantReason)
			}
			if strings.Contains(c.Message, "page 7") {
				t.Errorf("the condition tells the cause: %q", c.Message)
			}
		})
	}
	t.Run("a runtime error passes through unchanged", func(t *testing.T) {
		p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
		g, _ := ensure.NewGuard(ensuretest.NewMemoryStore(), p, ensure.CRIRuntime(newFakeNode(), newFakeNode()), ensure.GuardOptions{})
		down := errors.New("runtime down")
		if _, err := g.Status(context.Background(), &runtimeapi.StatusRequest{}, func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
			return nil, down
		}); !errors.Is(err, down) {
			t.Errorf("got %v", err)
		}
	})
}

// TestADatabaseThatCannotWriteSaysSo: while the records database's writes
// fail (a full or read-only filesystem), the records condition in the
// runtime's status and the guard's readiness say so, with the kind of
// cause and not its path; once a write succeeds again they recover by
// themselves.
func TestADatabaseThatCannotWriteSaysSo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cause error
		want  string
	}{
		{"a full filesystem", &os.PathError{Op: "write", Path: "/var/lib/cri-image-proxy/ensure.db", Err: syscall.ENOSPC}, "no space"},
		{"a read-only filesystem", &os.PathError{Op: "open", Path: "/var/lib/cri-image-proxy/ensure.db", Err: syscall.EROFS}, "read-only"},
		// bbolt gives the errors of growing the file as text only.
		{"a read-only filesystem, found as bbolt grows the file", errors.New("file resize error: truncate /var/lib/cri-image-proxy/ensure.db: read-only file system"), "read-only"},
		{"a full filesystem, found as bbolt grows the file", errors.New("file resize error: truncate /var/lib/cri-image-proxy/ensure.db: no space left on device"), "no space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			mem := s.store.(*ensuretest.MemoryStore)
			condition := func() *runtimeapi.RuntimeCondition {
				resp, err := s.guard.Status(context.Background(), &runtimeapi.StatusRequest{}, func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
					return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				return resp.Status.Conditions[0]
			}
			mem.FailWrites = tc.cause
			if got := s.start(podA, private, "IfNotPresent"); got != running {
				t.Fatalf("A: %s", got)
			}
			c := condition()
			if c.Status || c.Reason != "RecordsDatabaseNotWritable" || !strings.Contains(c.Message, tc.want) || strings.Contains(c.Message, "/var/lib") {
				t.Errorf("while writes fail: condition %v, want false, RecordsDatabaseNotWritable, saying %q without the path", c, tc.want)
			}
			if err := s.guard.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("while writes fail: ready %v, want an error saying %q", err, tc.want)
			}
			mem.FailWrites = nil
			if got := s.start(podA, private, "IfNotPresent"); got != running {
				t.Fatalf("A again: %s", got)
			}
			if c := condition(); !c.Status || c.Reason != "RecordsDatabaseOpen" {
				t.Errorf("once a write succeeded: condition %v, want true", c)
			}
			if err := s.guard.Ready(context.Background()); err != nil {
				t.Errorf("once a write succeeded: ready %v", err)
			}
		})
	}
}
