package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func jwt(t *testing.T, claims map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(claims)
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".c2ln"
}

func TestRun(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	os.WriteFile(creds, []byte("alice:a-s3cret\nbob:b-s3cret\n"), 0o600)
	logFile := filepath.Join(dir, "claims.log")
	o := options{audience: "registry.test", credentials: creds, annotation: "registry.test/user", log: logFile, now: func() time.Time { return now }}
	good := map[string]any{"aud": []string{"registry.test"}, "exp": now.Unix() + 3600, "nbf": now.Unix(),
		"kubernetes.io": map[string]any{"namespace": "team-a", "pod": map[string]string{"name": "p1", "uid": "pod-uid"},
			"serviceaccount": map[string]string{"name": "builder", "uid": "sa-uid"}}}
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range good {
			c[kk] = vv
		}
		c[k] = v
		return c
	}
	request := func(token string, ann map[string]string) string {
		b, _ := json.Marshal(map[string]any{"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "kind": "CredentialProviderRequest",
			"image": "registry.test:5000/team-a/app", "serviceAccountToken": token, "serviceAccountAnnotations": ann})
		return string(b)
	}
	for _, tc := range []struct {
		name    string
		token   string
		ann     map[string]string
		want    string // in the answer, or in the error
		wantErr bool
	}{
		{"a good token gets the annotated user's credentials for the image's registry", jwt(t, good), map[string]string{"registry.test/user": "alice"},
			`"auth":{"registry.test:5000":{"username":"alice","password":"a-s3cret"}}`, false},
		{"another audience is refused", jwt(t, with("aud", "other")), map[string]string{"registry.test/user": "alice"}, "audience", true},
		{"an expired token is refused", jwt(t, with("exp", now.Unix()-1)), map[string]string{"registry.test/user": "alice"}, "expired", true},
		{"a token not bound to a pod is refused", jwt(t, with("kubernetes.io", map[string]any{"namespace": "a"})), map[string]string{"registry.test/user": "alice"}, "not bound to a pod", true},
		{"no token is refused", "", map[string]string{"registry.test/user": "alice"}, "no service account token", true},
		{"no annotation is refused", jwt(t, good), nil, "no annotation", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(strings.NewReader(request(tc.token, tc.ann)), &out, o)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want an error with %q", err, tc.want)
				}
				return
			}
			if err != nil || !strings.Contains(out.String(), tc.want) || !strings.Contains(out.String(), `"kind":"CredentialProviderResponse"`) {
				t.Fatalf("got %v\n%s", err, out.String())
			}
		})
	}
	t.Run("a pod named by --user-for-pod gets that user's credentials, the others the annotation's", func(t *testing.T) {
		o := o
		o.podUsers = map[string]string{"p1": "bob"}
		other := with("kubernetes.io", map[string]any{"namespace": "team-a", "pod": map[string]string{"name": "p2", "uid": "pod-uid-2"},
			"serviceaccount": map[string]string{"name": "builder", "uid": "sa-uid"}})
		for token, want := range map[string]string{jwt(t, good): `"username":"bob","password":"b-s3cret"`, jwt(t, other): `"username":"alice","password":"a-s3cret"`} {
			var out bytes.Buffer
			if err := run(strings.NewReader(request(token, map[string]string{"registry.test/user": "alice"})), &out, o); err != nil || !strings.Contains(out.String(), want) {
				t.Errorf("got %v\n%s\nwant %s", err, out.String(), want)
			}
		}
	})
	t.Run("--cache-duration is answered as the response's cacheDuration", func(t *testing.T) {
		o := o
		zero := time.Duration(0)
		o.cacheDuration = &zero
		var out bytes.Buffer
		if err := run(strings.NewReader(request(jwt(t, good), map[string]string{"registry.test/user": "alice"})), &out, o); err != nil || !strings.Contains(out.String(), `"cacheDuration":"0s"`) {
			t.Errorf("got %v\n%s", err, out.String())
		}
	})
	log, _ := os.ReadFile(logFile)
	if !strings.Contains(string(log), `"podUID":"pod-uid"`) || strings.Contains(string(log), "eyJ") {
		t.Errorf("claims log: %s", log)
	}
}

// TestMain runs the plugin's main when a test re-executes the test binary
// as the plugin.
func TestMain(m *testing.M) {
	if os.Getenv("SA_TOKEN_PLUGIN_AS_MAIN") == "1" {
		os.Args = append([]string{"sa-token-credential-provider"}, strings.Fields(os.Getenv("SA_TOKEN_PLUGIN_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRefusesToRunWithoutTheTestFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, args string
		refused    bool
	}{
		{"without --for-tests-only it refuses before reading a request", "--audience a --credentials /nonexistent", true},
		{"with it, it runs (and fails on the empty request)", "--for-tests-only --audience a --credentials /nonexistent", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "SA_TOKEN_PLUGIN_AS_MAIN=1", "SA_TOKEN_PLUGIN_ARGS="+tc.args)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("want an exit error, got %v", err)
			}
			refused := exit.ExitCode() == 2 && strings.Contains(stderr.String(), "never deploy it")
			if refused != tc.refused {
				t.Errorf("refused %v, want %v (exit %d): %s", refused, tc.refused, exit.ExitCode(), stderr.String())
			}
		})
	}
}
