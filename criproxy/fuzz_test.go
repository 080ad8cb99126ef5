package criproxy

import (
	"strings"
	"testing"
)

// FuzzParseEndpoint: whatever the input, ParseEndpoint returns an error or
// a clean unix:///absolute endpoint that parses to itself.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"unix:///run/containerd/containerd.sock", "/run/x.sock", "unix://rel/x", "tcp://1.2.3.4:5", "unix:///a/../b", "", "unix:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(ep, "unix:///") {
			t.Fatalf("ParseEndpoint(%q) = %q: not unix:///", s, ep)
		}
		again, err := ParseEndpoint(ep)
		if err != nil || again != ep {
			t.Fatalf("ParseEndpoint(%q) = %q, which parses to %q, %v", s, ep, again, err)
		}
	})
}

func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want, wantErr string
	}{
		{"a unix URL is kept", "unix:///run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock", ""},
		{"an absolute path becomes a unix URL", "/run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock", ""},
		{"a path is cleaned", "unix:///run//x/../containerd.sock", "unix:///run/containerd.sock", ""},
		{"tcp is refused", "tcp://127.0.0.1:1234", "", "only unix sockets"},
		{"a relative unix path is refused", "unix://run/containerd.sock", "", "absolute"},
		{"an empty endpoint is refused", "", "", "empty"},
		{"a path gRPC would read as a URL fragment is refused", "/run/x#y.sock", "", "must not contain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEndpoint(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
