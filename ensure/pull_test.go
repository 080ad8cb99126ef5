package ensure_test

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
)

func TestTheRecordHoldsTheCredentialThatSucceeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		report      *pullreport.Credential // what the injector behind the guard says it pulled with
		wantNode    bool
		wantAccount bool
		wantHash    bool
	}{
		{"the request's credential refused, a node-wide plugin's accepted: node-wide", &pullreport.Credential{Provider: "ecr"}, true, false, false},
		{"the request's credential refused, a token plugin's accepted: the pod's account",
			&pullreport.Credential{Provider: "tp", ServiceAccount: &pullreport.ServiceAccountRef{Namespace: "ns", Name: "builder", UID: "sa-1"}}, false, true, false},
		{"the request's credential accepted: its hash", nil, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, ensure.NeverVerifyPreloadedImages)
			// The kubelet sends bob's credential; the injector behind the
			// guard retries with the plugin's (alice's) when it is refused.
			_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("bob:b-pw"), SandboxConfig: podBOwn.sandbox()},
				func(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					if tc.report == nil {
						return s.node.PullImage(ctx, req)
					}
					s.node.allowed["registry.test/team-a/app"]["bob:b-pw"] = false
					if _, err := s.node.PullImage(ctx, req); err == nil {
						t.Fatal("the registry accepted bob")
					}
					pullreport.Report(ctx, *tc.report)
					req.Auth = cred("alice:a-pw")
					return s.node.PullImage(ctx, req)
				})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := s.store.Get(refApp)
			if err != nil {
				t.Fatal(err)
			}
			c := rec.CredentialMapping["registry.test/team-a/app"]
			if c.NodePodsAccessible != tc.wantNode || (len(c.KubernetesServiceAccounts) > 0) != tc.wantAccount || (len(c.KubernetesSecrets) > 0) != tc.wantHash {
				t.Errorf("recorded %+v", c)
			}
		})
	}
}
