package signtest

import (
	"testing"

	"github.com/sigstore/sigstore-go/pkg/root"
)

// TestTrustedRootJSON: the authority's trusted root, written and read
// back, names its Rekor and CT logs under the keys verifiers look them up
// by, with its certificate and timestamp authorities.
func TestTrustedRootJSON(t *testing.T) {
	t.Parallel()
	a, err := NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.TrustedRootJSON()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := root.NewTrustedRootFromJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	for what, pair := range map[string][2]map[string]*root.TransparencyLog{
		"rekor": {a.vs.RekorLogs(), tr.RekorLogs()},
		"ct":    {a.vs.CTLogs(), tr.CTLogs()},
	} {
		want, got := pair[0], pair[1]
		if len(got) != len(want) {
			t.Fatalf("%s logs: %d, want %d", what, len(got), len(want))
		}
		for id := range want {
			if _, ok := got[id]; !ok {
				t.Errorf("%s log %s is not found by its key ID after the round trip", what, id)
			}
		}
	}
	if len(tr.FulcioCertificateAuthorities()) != 1 || len(tr.TimestampingAuthorities()) != 1 {
		t.Errorf("authorities: %d Fulcio, %d TSA", len(tr.FulcioCertificateAuthorities()), len(tr.TimestampingAuthorities()))
	}
}
