package registry

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEndpointFor(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	writeHostsToml(t, second, "registry.example", `server = "https://registry.example:8443/custom"

[host."https://mirror.example"]
  capabilities = ["pull", "resolve"]
`)
	writeHostsToml(t, first, "docker.io", `[host."https://dockerhub-mirror.example"]
  capabilities = ["pull", "resolve"]
`)
	c, err := New(Options{HostsDir: first + ":" + second, Vouched: []VouchedMirror{{Registry: "vouched.example", Endpoint: "https://cache.example/base"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, registry, want, ns string
		vouched                  bool
	}{
		{name: "docker.io is registry-1.docker.io, its mirror not asked", registry: "docker.io", want: "https://registry-1.docker.io/v2"},
		{name: "a registry with no hosts.toml is asked over https", registry: "quay.io", want: "https://quay.io/v2"},
		{name: "the server of hosts.toml, found in the second directory, with its path", registry: "registry.example", want: "https://registry.example:8443/custom/v2", ns: "registry.example"},
		{name: "a vouched mirror, its path kept", registry: "vouched.example", want: "https://cache.example/base/v2", ns: "vouched.example", vouched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := c.endpointFor(context.Background(), tc.registry)
			if err != nil {
				t.Fatal(err)
			}
			if ep.String() != tc.want || ep.namespace() != tc.ns || ep.vouched != tc.vouched {
				t.Errorf("got %s (ns %q, vouched %v), want %s (ns %q, vouched %v)", ep, ep.namespace(), ep.vouched, tc.want, tc.ns, tc.vouched)
			}
		})
	}
}

func TestEndpointForReadsAChangedHostsToml(t *testing.T) {
	dir := t.TempDir()
	writeHostsToml(t, dir, "registry.example", `server = "https://one.example"`)
	c, err := New(Options{HostsDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := c.endpointFor(context.Background(), "registry.example")
	if err != nil || ep.String() != "https://one.example/v2" {
		t.Fatalf("got %v, %v", ep, err)
	}
	writeHostsToml(t, dir, "registry.example", `server = "https://two.example"`)
	ep, err = c.endpointFor(context.Background(), "registry.example")
	if err != nil || ep.String() != "https://two.example/v2" {
		t.Fatalf("after the change: got %v, %v; want https://two.example/v2", ep, err)
	}
}

func TestReloadRefusesInvalidVouchedMirrors(t *testing.T) {
	c, err := New(Options{HostsDir: t.TempDir(), Vouched: []VouchedMirror{{Registry: "index.docker.io", Endpoint: "https://hub-cache.example"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		m    []VouchedMirror
		want string
	}{
		{name: "an empty registry", m: []VouchedMirror{{Endpoint: "https://m.example"}}, want: "is not a registry host"},
		{name: "a Docker Hub path for a registry", m: []VouchedMirror{{Registry: "mirror", Endpoint: "https://m.example"}}, want: "is not a registry host"},
		{name: "a registry with a path", m: []VouchedMirror{{Registry: "r.example/team", Endpoint: "https://m.example"}}, want: "is not a registry host"},
		{name: "an endpoint that is not http", m: []VouchedMirror{{Registry: "r.example", Endpoint: "ftp://m.example"}}, want: "http or https"},
		{name: "an endpoint with a user", m: []VouchedMirror{{Registry: "r.example", Endpoint: "https://u:SECRET@m.example"}}, want: "no user"},
		{name: "an endpoint with a query", m: []VouchedMirror{{Registry: "r.example", Endpoint: "https://m.example?x=1"}}, want: "no user, query"},
		{name: "a registry named twice", m: []VouchedMirror{{Registry: "r.example", Endpoint: "https://a.example"}, {Registry: "r.example", Endpoint: "https://b.example"}}, want: "named twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Reload(tc.m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if ep, err := c.endpointFor(context.Background(), "docker.io"); err != nil || !ep.vouched || ep.host.Host != "hub-cache.example" {
				t.Errorf("after a refused reload the vouched mirror changed: %v, %v", ep, err)
			}
		})
	}
}

func TestCheckUsesTheCAOfHostsToml(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, authNone)
	srv := httptest.NewTLSServer(e.reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	writeHostsToml(t, dir, "secure.test", fmt.Sprintf("server = %q\nca = %q\n", srv.URL, ca))
	writeHostsToml(t, dir, "untrusted.test", fmt.Sprintf("server = %q\n", srv.URL))
	c := e.newChecker(t, Options{HostsDir: dir})
	res, err := c.Check(context.Background(), Request{Image: "secure.test/team-a/app:v1", ImageID: string(e.imgID), Blobs: true})
	if err != nil || res.Endpoint != "https://"+host+"/v2" {
		t.Fatalf("with the CA of hosts.toml: got %+v, %v", res, err)
	}
	if _, err := c.Check(context.Background(), Request{Image: "untrusted.test/team-a/app:v1"}); !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without it: got %v, want ErrUnreachable for the certificate", err)
	}
}
