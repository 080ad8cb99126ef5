package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
)

// oneImage is a runtime holding one image (crireq.Images).
type oneImage crireq.Image

func (o oneImage) Image(context.Context, crireq.ImageQuery) (crireq.Image, bool, error) {
	return crireq.Image(o), true, nil
}

// TestThePolicyHooksTellPluginsTheServiceAccount: with ensure off and the
// kubernetes section on, the image policy's own hooks are built with the
// informer's pods, so that a plugin is told the service account of the
// pod a container is for, as with ensure on; without the section, it is
// told none.
func TestThePolicyHooksTellPluginsTheServiceAccount(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	requests := filepath.Join(dir, "requests")
	plugin := "#!/bin/sh\ncat >>" + requests + "\necho >>" + requests + "\n" +
		`echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"ok"}'` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "policy"), []byte(plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n"+
		"  - {name: policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [registry.test], namespaces: [secure]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: dir}
	cfg.SetDefaults()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := podtoken.New(podtokentest.API(fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "secure", Name: "web", UID: types.UID("uid-web")},
		Spec:       corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "builder"},
	})), "node-a", podtoken.Options{})
	src.Start(ctx)
	defer func() { cancel(); src.Wait() }()
	if !src.WaitForSync(ctx) {
		t.Fatal("the informer did not sync")
	}
	id := "sha256:" + strings.Repeat("7", 64)
	images := oneImage{ID: id, Names: []string{"registry.test/app:v1", "registry.test/app@sha256:" + strings.Repeat("8", 64)}}
	req := &runtimeapi.CreateContainerRequest{
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "secure", Name: "web", Uid: "uid-web"}},
		Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: id, UserSpecifiedImage: "registry.test/app:v1"}},
	}
	next := func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return &runtimeapi.CreateContainerResponse{ContainerId: "c"}, nil
	}
	for _, tc := range []struct {
		name     string
		identity *podtoken.Source
		want     string
	}{
		{"the kubernetes section on: the pod's service account", src, `"serviceAccount":"builder"`},
		{"no kubernetes section: none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Remove(requests); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			engine, err := newImagePolicy(cfg.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			d := &daemon{log: slog.New(slog.DiscardHandler), policy: engine, identity: tc.identity}
			if _, err := d.policyHooks(images).CreateContainer(ctx, req, next); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(requests)
			if err != nil {
				t.Fatalf("the plugin was not asked: %v", err)
			}
			got := string(b)
			if !strings.Contains(got, `"uid":"uid-web"`) {
				t.Fatalf("the plugin was not told the pod:\n%s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) || tc.want == "" && strings.Contains(got, "serviceAccount") {
				t.Errorf("the plugin was told:\n%s\nwant %s", got, tc.want)
			}
		})
	}
}
