package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/test/signtest"
)

const (
	testUser, testPassword = "tenant-a", "s3cret-pw"
	ciIdentity, ciIssuer   = "ci@example.com", "https://issuer.example.com"
)

// testRegistry is an in-process registry on the loopback, optionally
// behind basic auth.
type testRegistry struct {
	host string
	auth authn.Authenticator
}

func newTestRegistry(t *testing.T, referrersAPI, private bool) *testRegistry {
	t.Helper()
	var h http.Handler = ggcrregistry.New(ggcrregistry.WithReferrersSupport(referrersAPI), ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	r := &testRegistry{auth: authn.Anonymous}
	if private {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if u, p, ok := req.BasicAuth(); !ok || u != testUser || p != testPassword {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, req)
		})
		r.auth = authn.FromConfig(authn.AuthConfig{Username: testUser, Password: testPassword})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// push pushes a random image to repo and returns "host/repo@digest".
func (r *testRegistry) push(t *testing.T, repo string) string {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(r.host + "/" + repo + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(r.auth)); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return r.host + "/" + repo + "@" + d.String()
}

// world is what the tests sign with and verify against.
type world struct {
	dir       string
	key       *signtest.Key
	otherKey  *signtest.Key
	authority *signtest.Authority
	rootPath  string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{dir: t.TempDir()}
	var err error
	if w.key, err = signtest.NewKey(); err != nil {
		t.Fatal(err)
	}
	if w.otherKey, err = signtest.NewKey(); err != nil {
		t.Fatal(err)
	}
	if w.authority, err = signtest.NewAuthority(); err != nil {
		t.Fatal(err)
	}
	rootJSON, err := w.authority.TrustedRootJSON()
	if err != nil {
		t.Fatal(err)
	}
	w.rootPath = w.write(t, "trusted_root.json", string(rootJSON))
	w.write(t, "release.pub", string(w.key.PublicKeyPEM()))
	return w
}

func (w *world) write(t *testing.T, file, content string) string {
	t.Helper()
	p := filepath.Join(w.dir, file)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// policy writes a policy file: namespace secure takes the release key or
// the CI identity (SCTs ignored: the test authority issues none);
// namespace key-with-log takes the key only with a log entry; namespace
// keyless-strict wants SCTs.
func (w *world) policy(t *testing.T) string {
	t.Helper()
	return w.write(t, "policy.yaml", `apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
trustedRoot: `+w.rootPath+`
policies:
  - name: secure-signed
    namespaces: [secure]
    authorities:
      - name: release-key
        key: {path: `+filepath.Join(w.dir, "release.pub")+`}
      - name: ci
        keyless:
          identities: [{issuer: "`+ciIssuer+`", subject: "`+ciIdentity+`"}]
          certificateTransparency: Ignore
  - name: key-with-log
    namespaces: [key-with-log]
    authorities:
      - name: release-key
        key: {path: `+filepath.Join(w.dir, "release.pub")+`}
        transparencyLog: Require
  - name: keyless-strict
    namespaces: [keyless-strict]
    authorities:
      - name: ci
        keyless:
          identities: [{issuerRegExp: "^https://issuer\\.example\\.com$", subjectRegExp: "@example\\.com$"}]
`)
}

// ask runs the plugin on one request and returns its verdict.
func ask(t *testing.T, policy string, req policyapi.ImagePolicyRequest) *policyapi.ImagePolicyResponse {
	t.Helper()
	in, err := policyapi.EncodeRequest(policyapi.V1alpha1, req)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--policy", policy}, bytes.NewReader(in), &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	resp, err := policyapi.DecodeResponse(policyapi.V1alpha1, bytes.TrimSpace(out.Bytes()))
	if err != nil {
		t.Fatalf("the plugin's answer: %v\n%s", err, out.String())
	}
	return resp
}

// pullRequest is a PullImage request for image ("host/repo@digest").
func pullRequest(image, namespace string) policyapi.ImagePolicyRequest {
	repo, digest, _ := strings.Cut(image, "@")
	return policyapi.ImagePolicyRequest{Call: policyapi.CallPullImage, Image: repo + ":v1", Repository: repo, Digest: digest, Pod: policyapi.Pod{Namespace: namespace, Name: "web"}}
}

func TestVerdicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	policy := w.policy(t)
	other, err := signtest.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}

	type sign func(t *testing.T, image string, o signtest.Options) error
	byKey := func(k *signtest.Key) sign {
		return func(t *testing.T, image string, o signtest.Options) error {
			return signtest.SignWithKey(ctx, image, k, o)
		}
	}
	keyless := func(a *signtest.Authority, identity string) sign {
		return func(t *testing.T, image string, o signtest.Options) error {
			return signtest.SignKeyless(ctx, image, a, identity, ciIssuer, o)
		}
	}
	for _, tc := range []struct {
		name         string
		sign         sign // nil: unsigned
		format       signtest.Format
		referrersAPI bool
		otherDigest  bool // the signature signs another image
		namespace    string
		allowed      bool
		reason       string // in the operator's reason
	}{
		{"a key signature by cosign's tag convention allows", byKey(w.key), signtest.TagConvention, false, false, "secure", true, "authority release-key (key "},
		{"a key signature as a referrer allows, through the referrers API", byKey(w.key), signtest.Referrer, true, false, "secure", true, "authority release-key"},
		{"a key signature as a referrer allows, through the referrers tag of a registry without the API", byKey(w.key), signtest.Referrer, false, false, "secure", true, "referrer sha256:"},
		{"a keyless signature by the tag convention allows", keyless(w.authority, ciIdentity), signtest.TagConvention, false, false, "secure", true, "authority ci (keyless ci@example.com from https://issuer.example.com)"},
		{"a keyless signature as a referrer allows", keyless(w.authority, ciIdentity), signtest.Referrer, true, false, "secure", true, "authority ci"},
		{"an unsigned image is refused", nil, 0, true, false, "secure", false, "no signature of"},
		{"a signature by another key is refused", byKey(w.otherKey), signtest.TagConvention, false, false, "secure", false, "authority release-key"},
		{"a keyless signature by another identity is refused", keyless(w.authority, "intruder@example.org"), signtest.TagConvention, false, false, "secure", false, "intruder@example.org"},
		{"a keyless signature from an authority outside the trusted root is refused", keyless(other, ciIdentity), signtest.Referrer, true, false, "secure", false, "authority ci"},
		{"a valid signature of another image, attached to this one, is refused", byKey(w.key), signtest.TagConvention, false, true, "secure", false, "not this image"},
		{"a valid bundle of another image, attached as a referrer, is refused", keyless(w.authority, ciIdentity), signtest.Referrer, true, true, "secure", false, "authority ci"},
		{"a key signature without a log entry is refused where the log is required", byKey(w.key), signtest.TagConvention, false, false, "key-with-log", false, "authority release-key"},
		{"a keyless signature without an SCT is refused where SCTs are required", keyless(w.authority, ciIdentity), signtest.TagConvention, false, false, "keyless-strict", false, "signed certificate timestamp"},
		{"a namespace without a policy is refused", byKey(w.key), signtest.TagConvention, false, false, "elsewhere", false, `no policy of ` + policy + ` covers namespace "elsewhere"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := newTestRegistry(t, tc.referrersAPI, false)
			image := reg.push(t, "team/app")
			if tc.sign != nil {
				o := signtest.Options{Format: tc.format}
				if tc.otherDigest {
					o.SignedDigest = strings.SplitN(reg.push(t, "team/other"), "@", 2)[1]
				}
				if err := tc.sign(t, image, o); err != nil {
					t.Fatalf("signing: %v", err)
				}
			}
			resp := ask(t, policy, pullRequest(image, tc.namespace))
			t.Logf("allowed %v: %s", *resp.Allowed, resp.Reason)
			if *resp.Allowed != tc.allowed || !strings.Contains(resp.Reason, tc.reason) {
				t.Errorf("allowed %v, reason:\n%s\nwant allowed %v and %q", *resp.Allowed, resp.Reason, tc.allowed, tc.reason)
			}
			if !tc.allowed && resp.PodReason == "" {
				t.Error("a refusal without a reason for the pod")
			}
		})
	}
}

func TestPrivateRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	policy := w.policy(t)
	reg := newTestRegistry(t, false, true)
	image := reg.push(t, "team/private")
	if err := signtest.SignWithKey(ctx, image, w.key, signtest.Options{Auth: reg.auth}); err != nil {
		t.Fatal(err)
	}

	t.Run("without the pull's credential the registry refuses: refused, not cached", func(t *testing.T) {
		resp := ask(t, policy, pullRequest(image, "secure"))
		if *resp.Allowed || resp.CacheDuration == nil || resp.CacheDuration.Duration != 0 || !strings.Contains(resp.Reason, "cannot read the signatures") {
			t.Errorf("verdict %+v", resp)
		}
	})
	t.Run("with it, the signature is read and verifies; the password is in no answer", func(t *testing.T) {
		req := pullRequest(image, "secure")
		req.Credential = &policyapi.Credential{Username: testUser, Password: testPassword}
		resp := ask(t, policy, req)
		if !*resp.Allowed {
			t.Errorf("verdict %+v", resp)
		}
		req.Credential.Password = "wrong"
		resp = ask(t, policy, req)
		b, _ := json.Marshal(resp)
		if *resp.Allowed || strings.Contains(string(b), testPassword) || strings.Contains(string(b), "wrong") {
			t.Errorf("verdict %s", b)
		}
	})
}

func TestRequestsItCannotVerify(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	policy := w.policy(t)
	t.Run("an image known by ID only is refused: no digest to find signatures by", func(t *testing.T) {
		id := "sha256:" + strings.Repeat("1", 64)
		resp := ask(t, policy, policyapi.ImagePolicyRequest{Call: policyapi.CallCreateContainer, Image: id, ImageID: id, Pod: policyapi.Pod{Namespace: "secure"}})
		if *resp.Allowed || !strings.Contains(resp.Reason, "known by ID only") {
			t.Errorf("verdict %+v", resp)
		}
	})
	t.Run("an unreachable registry refuses, not cached", func(t *testing.T) {
		resp := ask(t, policy, pullRequest("127.0.0.1:1/team/app@sha256:"+strings.Repeat("a", 64), "secure"))
		if *resp.Allowed || resp.CacheDuration == nil || resp.CacheDuration.Duration != 0 {
			t.Errorf("verdict %+v", resp)
		}
	})
	for _, tc := range []struct{ name, stdin string }{
		{"garbage on stdin is an error, not a verdict", "not json"},
		{"another apiVersion is an error", `{"apiVersion":"imagepolicy.cri-image-proxy.io/v9","kind":"ImagePolicyRequest"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(context.Background(), []string{"--policy", policy}, strings.NewReader(tc.stdin), &out); err == nil || out.Len() > 0 {
				t.Errorf("err %v, stdout %q", err, out.String())
			}
		})
	}
}

func TestLoadPolicyErrors(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	head := "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: SigstoreImagePolicy\n"
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"an unknown field is refused with its path", head + "policies:\n  - name: p\n    namespace: [a]\n", []string{`unknown field "policies[0].namespace"`}},
		{"keyless without a trusted root is refused", head + "policies:\n  - name: p\n    namespaces: [a]\n    authorities:\n      - name: ci\n        keyless: {identities: [{issuer: i, subject: s}]}\n",
			[]string{"trustedRoot: Required value: policies[0].authorities[0] needs a trusted root"}},
		{"every bad field is named at once", head + "trustedRoot: " + w.rootPath + "\nregistries: [{host: 'r.test', endpoint: 'ftp://x'}]\npolicies:\n  - name: p\n    namespaces: [Bad_NS]\n    images: ['[x']\n    authorities:\n" +
			"      - name: both\n        key: {path: /nonexistent.pub}\n        keyless: {identities: []}\n" +
			"      - name: k\n        key: {path: /nonexistent.pub}\n" +
			"      - name: kl\n        transparencyLog: Sometimes\n        keyless: {identities: [{issuer: i, subject: s, subjectRegExp: '('}], certificateTransparency: Maybe}\n",
			[]string{`registries[0].endpoint: Invalid value: "ftp://x"`, `policies[0].namespaces[0]: Invalid value: "Bad_NS"`, `policies[0].images[0]`,
				`policies[0].authorities[0]: Invalid value: "both": exactly one of key and keyless`,
				`policies[0].authorities[1].key: Invalid value: "/nonexistent.pub"`,
				`policies[0].authorities[2].transparencyLog: Unsupported value: "Sometimes"`,
				`policies[0].authorities[2].keyless.identities[0]: Invalid value: "s(": exactly one of subject and subjectRegExp`,
				`policies[0].authorities[2].keyless.certificateTransparency: Unsupported value: "Maybe"`}},
		{"a policy without authorities is refused", head + "policies:\n  - name: p\n    namespaces: ['*']\n", []string{"policies[0].authorities: Required value"}},
		{"another kind is refused", "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\npolicies: []\n", []string{`apiVersion/kind is`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadPolicy(w.write(t, strings.ReplaceAll(tc.name, " ", "-")+".yaml", tc.body))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
		})
	}
}

func TestRegistryEndpoint(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	reg := newTestRegistry(t, false, false)
	image := reg.push(t, "team/app")
	if err := signtest.SignWithKey(context.Background(), image, w.key, signtest.Options{}); err != nil {
		t.Fatal(err)
	}
	// The image is named registry.rig.test, a name no resolver knows; the
	// policy says where that registry is.
	policy := w.write(t, "endpoint.yaml", `apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
registries: [{host: registry.rig.test, endpoint: "http://`+reg.host+`"}]
policies:
  - name: p
    namespaces: ["*"]
    images: [registry.rig.test]
    authorities: [{name: release-key, key: {path: `+filepath.Join(w.dir, "release.pub")+`}}]
`)
	_, digest, _ := strings.Cut(image, "@")
	resp := ask(t, policy, pullRequest("registry.rig.test/team/app@"+digest, "any"))
	if !*resp.Allowed {
		t.Errorf("verdict %+v", resp)
	}

	t.Run("every spelling of the host finds its policy and its endpoint, as the proxy matches them", func(t *testing.T) {
		spelt := w.write(t, "spelt.yaml", `apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
registries: [{host: Registry.Rig.Test, endpoint: "http://`+reg.host+`"}]
policies:
  - name: p
    namespaces: ["*"]
    images: [REGISTRY.rig.test/team]
    authorities: [{name: release-key, key: {path: `+filepath.Join(w.dir, "release.pub")+`}}]
`)
		for _, repo := range []string{"registry.rig.test/team/app", "REGISTRY.RIG.TEST/team/app", "registry.rig.test:443/team/app"} {
			if resp := ask(t, spelt, pullRequest(repo+"@"+digest, "any")); !*resp.Allowed {
				t.Errorf("%s: verdict %+v", repo, resp)
			}
		}
		if resp := ask(t, spelt, pullRequest("registry.rig.test:5000/team/app@"+digest, "any")); *resp.Allowed || !strings.Contains(resp.Reason, "no policy of") {
			t.Errorf("another port: verdict %+v, want no policy", resp)
		}
	})
	t.Run("two entries for one host in two spellings are refused", func(t *testing.T) {
		dup := w.write(t, "dup.yaml", `apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
registries: [{host: registry.rig.test, endpoint: "http://`+reg.host+`"}, {host: REGISTRY.RIG.TEST}]
policies: [{name: p, namespaces: ["*"], authorities: [{name: k, key: {path: `+filepath.Join(w.dir, "release.pub")+`}}]}]
`)
		if _, err := LoadPolicy(dup); err == nil || !strings.Contains(err.Error(), `registries[1].host: Duplicate value: "REGISTRY.RIG.TEST"`) {
			t.Errorf("got %v", err)
		}
	})
}

func TestClip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"a registry's control characters are replaced, lines and tabs kept", "UNAUTHORIZED\r\x1b[31m\n\tx", "UNAUTHORIZED??[31m\n\tx"},
		{"invalid UTF-8 is replaced", "a\xffb", "a?b"},
		{"a long reason is cut to the API's bound", strings.Repeat("é", 3000), strings.Repeat("é", (policyapi.MaxReason-len("…(truncated)"))/2) + "…(truncated)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := clip(tc.in)
			if got != tc.want {
				t.Errorf("clip(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if _, err := policyapi.EncodeResponse(policyapi.V1alpha1, policyapi.Deny(got, "x")); err != nil {
				t.Errorf("the clipped reason is refused: %v", err)
			}
		})
	}
}
