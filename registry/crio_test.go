package registry

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeRegistriesConf writes dir/registries.conf with content, where HOST,
// MIRROR and TLSHOST stand for the test servers' host:port.
func writeRegistriesConf(t testing.TB, dir, content string, hosts map[string]string) string {
	t.Helper()
	for k, v := range hosts {
		content = strings.ReplaceAll(content, k, v)
	}
	p := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckWithRegistriesConf(t *testing.T) {
	e := newEnv(t, authBasic)
	// A mirror of the same content that serves anyone: asked, it would let
	// any credential pass.
	mirror := newTestRegistry(t, authNone, e.reg.store)
	tlsSrv := httptest.NewTLSServer(e.reg)
	t.Cleanup(tlsSrv.Close)
	tlsHost := strings.TrimPrefix(tlsSrv.URL, "https://")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw})
	hosts := map[string]string{"TLSHOST": tlsHost, "MIRROR": mirror.host, "HOST": e.reg.host}

	for _, tc := range []struct {
		name    string
		conf    string
		certs   map[string]string // file under certs.d -> content ("CA": the TLS server's CA)
		vouched []VouchedMirror
		image   string
		cred    Credential
		want    error
		errText string
		// endpoint is the one asked; path a request the registry must see.
		endpoint, path string
		vouchedEp      bool
	}{
		{
			name:  "a mirror that serves anyone is never asked: another repository's credential is refused",
			conf:  "[[registry]]\nlocation = \"HOST\"\ninsecure = true\n\n[[registry.mirror]]\nlocation = \"MIRROR\"\ninsecure = true\n",
			image: "HOST/team-a/app:v1", cred: bob(), want: ErrDenied,
		},
		{
			name:  "an insecure registry on plain HTTP is asked over http, and its word taken",
			conf:  "[[registry]]\nlocation = \"HOST\"\ninsecure = true\n\n[[registry.mirror]]\nlocation = \"MIRROR\"\ninsecure = true\n",
			image: "HOST/team-a/app:v1", cred: alice(), endpoint: "https://HOST/v2", path: "/v2/team-a/app/manifests/v1",
		},
		{
			name:  "a registry on plain HTTP that is not insecure is unreachable: https only",
			conf:  "[[registry]]\nlocation = \"HOST\"\n",
			image: "HOST/team-a/app:v1", cred: alice(), want: ErrUnreachable,
		},
		{
			name:  "a blocked registry is refused without a request",
			conf:  "[[registry]]\nprefix = \"HOST/team-a\"\nlocation = \"HOST/team-a\"\nblocked = true\n",
			image: "HOST/team-a/app:v1", cred: alice(), want: ErrDenied, errText: "blocked = true",
		},
		{
			name:  "a location on the registry's host moves the repository, and the check asks for it there",
			conf:  "[[registry]]\nprefix = \"HOST/alias\"\nlocation = \"HOST/team-a\"\ninsecure = true\n",
			image: "HOST/alias/app:v1", cred: alice(), endpoint: "https://HOST/v2", path: "/v2/team-a/app/manifests/v1",
		},
		{
			name:  "a location on another host is skipped like a mirror: the image's own registry refuses",
			conf:  "[[registry]]\nprefix = \"TLSHOST\"\nlocation = \"MIRROR\"\ninsecure = true\n",
			certs: map[string]string{"TLSHOST/ca.crt": "CA"},
			image: "TLSHOST/team-a/app:v1", cred: bob(), want: ErrDenied,
		},
		{
			name:  "the image's own registry is asked with the CA of containers' certs.d",
			conf:  "[[registry]]\nprefix = \"TLSHOST\"\nlocation = \"MIRROR\"\ninsecure = true\n",
			certs: map[string]string{"TLSHOST/ca.crt": "CA"},
			image: "TLSHOST/team-a/app:v1", cred: alice(), endpoint: "https://TLSHOST/v2", path: "/v2/team-a/app/manifests/v1",
		},
		{
			name:  "without the CA the registry's certificate is refused",
			conf:  "",
			image: "TLSHOST/team-a/app:v1", cred: alice(), want: ErrUnreachable, errText: "certificate",
		},
		{
			name:  "a client certificate without its key is a configuration error naming the file",
			conf:  "",
			certs: map[string]string{"TLSHOST/ca.crt": "CA", "TLSHOST/client.cert": "CA"},
			image: "TLSHOST/team-a/app:v1", cred: alice(), want: ErrUnreachable, errText: "client.cert has no key client.key",
		},
		{
			name:    "a vouched mirror that a mirror entry names is asked as the runtime would, its repository rewritten",
			conf:    "[[registry]]\nprefix = \"registry.test/alias\"\nlocation = \"registry.test/alias\"\n\n[[registry.mirror]]\nlocation = \"HOST/team-a\"\ninsecure = true\n",
			vouched: []VouchedMirror{{Registry: "registry.test", Endpoint: "https://HOST"}},
			image:   "registry.test/alias/app:v1", cred: alice(), endpoint: "https://HOST/v2", path: "/v2/team-a/app/manifests/v1", vouchedEp: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			certs := filepath.Join(dir, "certs.d")
			for f, content := range tc.certs {
				p := filepath.Join(certs, strings.ReplaceAll(f, "TLSHOST", tlsHost))
				if content == "CA" {
					content = string(caPEM)
				}
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tc.vouched {
				tc.vouched[i].Endpoint = strings.ReplaceAll(tc.vouched[i].Endpoint, "HOST", e.reg.host)
			}
			c := e.newChecker(t, Options{RegistriesConf: writeRegistriesConf(t, dir, tc.conf, hosts), CertsDir: certs, Vouched: tc.vouched})
			e.reg.requests()
			image := strings.NewReplacer("TLSHOST", tlsHost, "HOST", e.reg.host).Replace(tc.image)
			res, err := c.Check(context.Background(), Request{Image: image, ImageID: string(e.imgID), Credential: tc.cred, Blobs: true})
			seen := e.reg.requests()
			if tc.want != nil {
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got %v, want %v with %q", err, tc.want, tc.errText)
				}
			} else if err != nil {
				t.Fatalf("got %v, want verified", err)
			}
			if n := len(mirror.requests()); n != 0 {
				t.Errorf("the mirror was asked %d times", n)
			}
			if tc.errText == "blocked = true" && len(seen) != 0 {
				t.Errorf("a blocked registry was asked: %v", seen)
			}
			if tc.endpoint != "" {
				if want := strings.NewReplacer("TLSHOST", tlsHost, "HOST", e.reg.host).Replace(tc.endpoint); res.Endpoint != want || res.Vouched != tc.vouchedEp {
					t.Errorf("asked %s (vouched %v), want %s (%v)", res.Endpoint, res.Vouched, want, tc.vouchedEp)
				}
			}
			if tc.path != "" && !containsRequest(seen, tc.path) {
				t.Errorf("the registry saw no request for %s: %v", tc.path, seen)
			}
			for _, r := range seen {
				if r.ns != "" {
					t.Errorf("%s %s carried ns=%s: containers/image adds none", r.method, r.path, r.ns)
				}
			}
			assertNoSecret(t, "the error", errAttr(err).Value.String())
		})
	}
}

func containsRequest(seen []seenRequest, path string) bool {
	for _, r := range seen {
		if r.path == path {
			return true
		}
	}
	return false
}

func TestRegistriesConfChangesAndReload(t *testing.T) {
	e := newEnv(t, authBasic)
	dir := t.TempDir()
	hosts := map[string]string{"HOST": e.reg.host}
	insecure := "[[registry]]\nlocation = \"HOST\"\ninsecure = true\n"
	path := writeRegistriesConf(t, dir, insecure, hosts)
	var logs bytes.Buffer
	c := e.newChecker(t, Options{RegistriesConf: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	check := func() error {
		_, err := c.Check(context.Background(), Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice()})
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("with the insecure registry: %v", err)
	}

	// An edit that breaks the file: refused by Reload, naming the file and
	// the line; the checks keep the configuration read before, and the log
	// says so once.
	writeRegistriesConf(t, dir, insecure+"[[registry]\n", hosts)
	if err := c.Reload(nil); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("Reload of a broken file: got %v, want an error naming %s and its line", err, path)
	}
	for range 2 {
		if err := check(); err != nil {
			t.Fatalf("with a broken file the check lost the configuration read before: %v", err)
		}
	}
	if n := strings.Count(logs.String(), "does not parse"); n != 1 {
		t.Errorf("the broken file was logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), path) {
		t.Errorf("the log does not name the file:\n%s", logs.String())
	}

	// A valid change is read at the next check, without a reload.
	writeRegistriesConf(t, dir, "[[registry]]\nlocation = \"HOST\"\ninsecure = true\nblocked = true\n", hosts)
	if err := check(); !errors.Is(err, ErrDenied) {
		t.Fatalf("after the registry was blocked: got %v, want ErrDenied", err)
	}
	writeRegistriesConf(t, dir, insecure, hosts)
	if err := c.Reload(nil); err != nil {
		t.Fatal(err)
	}
	if err := check(); err != nil {
		t.Fatalf("after it was unblocked and reloaded: %v", err)
	}
}
