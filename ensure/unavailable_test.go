package ensure_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// TestADatabaseThatCannotBeOpenedFailsClosed runs the guard over the
// stand-in for a records database that could not be opened: an image a
// policy would ever want verified is refused to every pod, whatever its
// credentials, and the pull is refused without the cause; an image the
// policy never verifies still runs.
func TestADatabaseThatCannotBeOpenedFailsClosed(t *testing.T) {
	t.Parallel()
	const cause = "invalid database: page 7 out of range"
	tests := []struct {
		policy    decision.PolicyName
		allowlist []string
		// runs are the images a pod without credentials may still run.
		runs map[string]bool
	}{
		{policy: decision.NeverVerify, runs: map[string]bool{private: true, public: true}},
		{policy: decision.NeverVerifyPreloadedImages},
		{policy: decision.NeverVerifyAllowlistedImages, allowlist: []string{"registry.test/public/*"}, runs: map[string]bool{public: true}},
		{policy: decision.AlwaysVerify},
	}
	if len(tests) != len(decision.Policies) {
		t.Fatalf("the test covers %d policies, there are %d", len(tests), len(decision.Policies))
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, tt.policy, tt.allowlist...)
			s.node.preload(private, refApp)
			s.node.preload(public, refTool)
			s.store = ensure.UnavailableStore(errors.New(cause))
			s.restart(t, tt.policy, tt.allowlist...)

			if err := s.guard.RecordsAvailable(); !errors.Is(err, ensure.ErrRecordsUnavailable) || !strings.Contains(err.Error(), cause) {
				t.Errorf("RecordsAvailable() = %v, want the cause for the operator", err)
			}
			for _, img := range []string{private, public} {
				want := map[bool][]kubeletResult{true: {running, running, running}, false: {errImagePull, errImagePull, errNeverPull}}[tt.runs[img]]
				got := []kubeletResult{s.start(podA, img, "IfNotPresent"), s.start(podB, img, "IfNotPresent"), s.start(podB, img, "Never")}
				if strings.Join(kr(got), ",") != strings.Join(kr(want), ",") {
					t.Errorf("%s for A (credentials), B (IfNotPresent), B (Never): %v, want %v", img, got, want)
				}
				// A container restart: the kubelet creates from the image ID it
				// found before, with no ImageStatus or pull.
				_, err := s.guard.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
					Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: map[string]string{private: refApp, public: refTool}[img], UserSpecifiedImage: img}},
					SandboxConfig: podB.sandbox(),
				}, s.node.CreateContainer)
				if allowed := err == nil; allowed != tt.runs[img] {
					t.Errorf("CreateContainer of %s by ID: %v", img, err)
				}
			}
			if tt.runs[private] {
				return
			}
			_, err := s.guard.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()}, s.node.PullImage)
			if st := status.Convert(toStatus(err)); st.Code() != codes.Unavailable || strings.Contains(st.Message(), "page 7") {
				t.Errorf("a pull while the records are unavailable: %v, want Unavailable without the cause", err)
			}
			if !strings.Contains(s.log.String(), "page 7") {
				t.Errorf("the operator's log does not say why:\n%s", s.log.String())
			}
		})
	}
}

func kr(rs []kubeletResult) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}
