package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.json")
	b64 := base64.StdEncoding.EncodeToString([]byte("bob:b-s3cret"))
	os.WriteFile(cfg, []byte(`{"auths": {
		"127.0.0.1:5000": {"username": "alice", "password": "a-s3cret"},
		"https://registry.test/v1/": {"auth": "`+b64+`"},
		"registry.test/team": {"username": "team", "password": "t"},
		"other.test": {"username": "x", "password": "y"}
	}}`), 0o600)
	for _, tc := range []struct {
		name, request, want string
	}{
		{"a v1 request gets a v1 answer with the registry's entry",
			`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"127.0.0.1:5000/team-a/app"}`,
			`{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","auth":{"127.0.0.1:5000":{"username":"alice","password":"a-s3cret"}}}`},
		{"a v1alpha1 request gets a v1alpha1 answer; auth is decoded; a path key makes it per image",
			`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","kind":"CredentialProviderRequest","image":"registry.test/team/app"}`,
			`{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","cacheKeyType":"Image","auth":{"registry.test":{"username":"bob","password":"b-s3cret"},"registry.test/team":{"username":"team","password":"t"}}}`},
		{"another path of a registry with a narrower key gets the registry's entry per image, so the narrower key is never hidden",
			`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"registry.test/other/app"}`,
			`{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","auth":{"registry.test":{"username":"bob","password":"b-s3cret"}}}`},
		{"an image no entry matches gets an empty answer",
			`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","kind":"CredentialProviderRequest","image":"nowhere.test/app"}`,
			`{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","cacheKeyType":"Registry"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(strings.NewReader(tc.request), &out, cfg); err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out.String()); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	t.Run("docker login's Docker Hub key answers for Docker Hub images, as the kubelet's keyring serves them", func(t *testing.T) {
		hub := filepath.Join(t.TempDir(), "config.json")
		os.WriteFile(hub, []byte(`{"auths": {"https://index.docker.io/v1/": {"username": "hub", "password": "h"}}}`), 0o600)
		for _, image := range []string{"docker.io/library/nginx", "docker.io/org/app"} {
			var out bytes.Buffer
			req := `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"` + image + `"}`
			if err := run(strings.NewReader(req), &out, hub); err != nil {
				t.Fatal(err)
			}
			want := `{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","auth":{"index.docker.io":{"username":"hub","password":"h"}}}`
			if got := strings.TrimSpace(out.String()); got != want {
				t.Errorf("%s:\ngot  %s\nwant %s", image, got, want)
			}
		}
	})
	t.Run("a broken config is an error that does not quote it", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "config.json")
		os.WriteFile(bad, []byte(`{"auths": {"r": {"password": "s3cret"`), 0o600)
		err := run(strings.NewReader(`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"r/x"}`), &bytes.Buffer{}, bad)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("a request that is not one is an error", func(t *testing.T) {
		if err := run(strings.NewReader(`{"apiVersion":"v1","kind":"Pod"}`), &bytes.Buffer{}, cfg); err == nil {
			t.Errorf("accepted a Pod")
		}
	})
}
