package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/test/signtest"
)

// TestThroughTheEngine runs the built plugin as the proxy does: an
// imagepolicy.Engine execs it, with the pull's credential, for a signed
// and an unsigned image of a private registry, at pull and at create.
func TestThroughTheEngine(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "sigstore-image-policy"), ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building the plugin: %v", err)
	}
	ctx := context.Background()
	w := newWorld(t)
	reg := newTestRegistry(t, false, true)
	signed, unsigned := reg.push(t, "team/signed"), reg.push(t, "team/unsigned")
	if err := signtest.SignKeyless(ctx, signed, w.authority, ciIdentity, ciIssuer, signtest.Options{Auth: reg.auth}); err != nil {
		t.Fatal(err)
	}
	e, err := imagepolicy.New(&imagepolicy.Config{BinDir: bin, Hash: "test", Providers: []imagepolicy.Provider{{
		Name: "sigstore-image-policy", APIVersion: policyapi.V1alpha1, MatchImages: []string{reg.host}, Namespaces: []string{"secure"},
		Timeout: time.Minute, FailurePolicy: imagepolicy.Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
		SendCredentials: true, Args: []string{"--policy", w.policy(t)},
	}}}, imagepolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cred := &imagepolicy.Credential{Username: testUser, Password: testPassword}
	subject := func(image string) imagepolicy.Subject {
		repo, digest, _ := strings.Cut(image, "@")
		return imagepolicy.Subject{Call: imagepolicy.CallPullImage, Image: repo + ":v1", Repository: repo, Digest: digest,
			Pod: imagepolicy.Pod{Namespace: "secure", Name: "web", UID: "uid-1"}, Credential: cred}
	}

	v, err := e.Decide(ctx, subject(signed))
	if err != nil || !v.Allowed {
		t.Fatalf("signed image: %+v, %v", v, err)
	}
	id := "sha256:" + strings.Repeat("5", 64)
	e.Bind(v, id)
	// The pulled image is listed under the pull's repository: a create by
	// its ID is decided as that repository's image.
	signedRepo, _, _ := strings.Cut(signed, "@")
	c, _ := e.Decide(ctx, imagepolicy.Subject{Call: imagepolicy.CallCreateContainer, Image: id, ImageID: id, Repository: signedRepo, Pod: imagepolicy.Pod{Namespace: "secure"}})
	if !c.Allowed || !c.Decisions[0].FromCache {
		t.Errorf("create of the signed image by ID: %+v", c)
	}

	v, _ = e.Decide(ctx, subject(unsigned))
	if v.Allowed || v.PodReason != "image is not signed" || !strings.Contains(v.Err().Error(), "image is not signed") {
		t.Errorf("unsigned image: %+v", v)
	}
	other := "sha256:" + strings.Repeat("6", 64)
	c, _ = e.Decide(ctx, imagepolicy.Subject{Call: imagepolicy.CallCreateContainer, Image: other[:19], ImageID: other, Pod: imagepolicy.Pod{Namespace: "secure"}})
	if c.Allowed || !strings.Contains(c.Reason(), "known by ID only") {
		t.Errorf("create of an image by ID that no pull allowed: %+v", c)
	}
}
