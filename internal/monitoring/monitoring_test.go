package monitoring

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEndpoints(t *testing.T) {
	t.Parallel()
	var down, recordsDown atomic.Bool
	ready := func(context.Context) error {
		if down.Load() {
			return errors.New("runtime unix:///x.sock: Version: connection refused")
		}
		return nil
	}
	records := func(context.Context) error {
		if recordsDown.Load() {
			return errors.New("the records database is unavailable: invalid database")
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	s, err := New(reg, reg, ready, slog.New(slog.DiscardHandler), Options{Checks: []ReadyFunc{records}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + l.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	for _, tc := range []struct {
		name     string
		down     bool
		records  bool // the extra check fails
		path     string
		wantCode int
		wantBody string
	}{
		{"healthz answers while the process runs", true, false, "/healthz", 200, "ok"},
		{"readyz answers ok when the runtime does", false, false, "/readyz", 200, "ok"},
		{"readyz says why when the runtime does not answer", true, false, "/readyz", 503, "connection refused"},
		{"readyz fails on a failed extra check, naming it", false, true, "/readyz", 503, "records database"},
		{"backend_up is 1 when the runtime answers", false, false, "/metrics", 200, "cri_image_proxy_backend_up 1"},
		{"backend_up stays 1 when only an extra check fails", false, true, "/metrics", 200, "cri_image_proxy_backend_up 1"},
		{"backend_up is 0 when it does not", true, false, "/metrics", 200, "cri_image_proxy_backend_up 0"},
		{"other paths are not found", false, false, "/debug/pprof/", 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down.Store(tc.down)
			recordsDown.Store(tc.records)
			code, body := get(tc.path)
			if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
}
