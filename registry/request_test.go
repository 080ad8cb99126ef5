package registry

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseImage(t *testing.T) {
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, image                        string
		registry, repository, object, desc string
		invalid                            bool
	}{
		{name: "a short Docker Hub name is library/<name>:latest at docker.io", image: "nginx", registry: "docker.io", repository: "library/nginx", object: "latest"},
		{name: "a registry with a port and a tag", image: "registry.example:5000/team/app:v1", registry: "registry.example:5000", repository: "team/app", object: "v1"},
		{name: "a digest reference asks for the digest", image: "registry.example/app@" + d, registry: "registry.example", repository: "app", object: d},
		{name: "a tag and a digest ask for the digest", image: "registry.example/app:v1@" + d, registry: "registry.example", repository: "app", object: d},
		{name: "an image ID is no reference", image: d, invalid: true},
		{name: "what does not parse is invalid", image: "Registry.example/App:v1", invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := parseImage(tc.image)
			if tc.invalid {
				if !errors.Is(err, errInvalidRequest) {
					t.Fatalf("got %+v, %v; want invalid", n, err)
				}
				return
			}
			if err != nil || n.registry != tc.registry || n.repository != tc.repository || n.object != tc.object {
				t.Errorf("got %+v, %v; want %s %s %s", n, err, tc.registry, tc.repository, tc.object)
			}
		})
	}
}

func TestCheckRefusesAnInvalidRequestWithoutAsking(t *testing.T) {
	e := newEnv(t, authBasic)
	for _, r := range []Request{
		{Image: "not a reference"},
		{Image: e.image("team-a/app:v1"), ImageID: "sha256:nothex"},
	} {
		_, err := e.checker.Check(context.Background(), r)
		if err == nil || errors.Is(err, ErrDenied) || errors.Is(err, ErrMoved) || errors.Is(err, ErrUnreachable) {
			t.Errorf("%+v: got %v, want an invalid request error", r, err)
		}
	}
	if seen := e.reg.requests(); len(seen) != 0 {
		t.Errorf("the registry was asked: %+v", seen)
	}
}

func TestMetricsCountChecksByRegistryAndResult(t *testing.T) {
	e := newEnv(t, authBasic)
	reg := prometheus.NewRegistry()
	c := e.newChecker(t, Options{Registerer: reg})
	ctx := context.Background()
	c.Check(ctx, Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true})
	c.Check(ctx, Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: bob(), Blobs: true})
	c.Check(ctx, Request{Image: e.image("team-a/app:v2"), ImageID: string(e.imgID), Credential: alice()})
	for _, tc := range []struct {
		metric string
		c      prometheus.Collector
		want   float64
	}{
		{"verified", c.metrics.checks.WithLabelValues(e.reg.host, "https://"+e.reg.host, resultVerified), 1},
		{"denied", c.metrics.checks.WithLabelValues(e.reg.host, "https://"+e.reg.host, resultDenied), 1},
		{"moved", c.metrics.checks.WithLabelValues(e.reg.host, "https://"+e.reg.host, resultMoved), 1},
		{"blobs present", c.metrics.blobs.WithLabelValues(e.reg.host, "https://"+e.reg.host, "present"), 3},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.metric, got, tc.want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "cri_image_proxy_registry_") {
			t.Errorf("metric %s outside cri_image_proxy_registry_", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "registry" && l.GetName() != "endpoint" && l.GetName() != "result" {
					t.Errorf("%s has label %s", mf.GetName(), l.GetName())
				}
				assertNoSecret(t, "a metric label", l.GetValue())
				if strings.Contains(l.GetValue(), "team-a") {
					t.Errorf("%s has a repository in a label: %s", mf.GetName(), l.GetValue())
				}
			}
		}
	}
}

// authFields is a CRI auth's fields, as a test gives them.
type authFields struct{ user, pass, auth, identity, token string }

func (a authFields) GetUsername() string      { return a.user }
func (a authFields) GetPassword() string      { return a.pass }
func (a authFields) GetAuth() string          { return a.auth }
func (a authFields) GetIdentityToken() string { return a.identity }
func (a authFields) GetRegistryToken() string { return a.token }

func TestCredentialOfDecodesTheAuthFieldAsTheRuntimeDoes(t *testing.T) {
	t.Parallel()
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name string
		in   authFields
		want Credential
	}{
		{"a user and password as they are", authFields{user: "alice", pass: "pw", auth: b64("bob:other")}, Credential{Username: "alice", Password: "pw"}},
		{"the auth field alone, decoded", authFields{auth: b64("alice:pw:with:colons")}, Credential{Username: "alice", Password: "pw:with:colons"}},
		{"an auth field that is no base64: nothing", authFields{auth: "not base64!"}, Credential{}},
		{"tokens as they are", authFields{identity: "id", token: "rt"}, Credential{IdentityToken: "id", RegistryToken: "rt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CredentialOf(tc.in); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
