package admin_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

func TestTheClientSeesWhatTheDaemonsLocalServiceSees(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := records.Open(filepath.Join(dir, "ensure.db"), records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ref := "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	intent, _ := store.AddIntent("registry.test/app:v1")
	if err := store.RecordPull(ref, "registry.test/app", records.Credential{Hash: "h"}, intent, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "admin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: admin.NewHandler(&admin.Local{Store: store})}
	go srv.Serve(l)
	defer srv.Close()

	c, err := admin.Dial(filepath.Join(dir, "admin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"list gives the record", func() error {
			ex, err := c.List(ctx)
			if err == nil && (len(ex.Records) != 1 || ex.Records[0].ImageRef != ref) {
				err = errors.New("wrong records")
			}
			return err
		}},
		{"a missing record is ErrNotFound across the socket", func() error {
			_, err := c.Get(ctx, "sha256:2222222222222222222222222222222222222222222222222222222222222222")
			if !errors.Is(err, ensure.ErrNotFound) {
				return errors.New("not ErrNotFound: " + err.Error())
			}
			return nil
		}},
		{"revoking the image clears its credentials", func() error {
			r, err := c.RevokeImage(ctx, ref)
			if err == nil && r.Records != 1 {
				err = errors.New("nothing revoked")
			}
			return err
		}},
		{"without a runtime, explain says what it needs", func() error {
			if _, err := c.Explain(ctx, ref, "uid"); err == nil {
				return errors.New("explain answered without a guard")
			}
			return nil
		}},
	} {
		if err := tc.run(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
