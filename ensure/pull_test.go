package ensure_test

import (
	"context"
	"iter"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

func TestTheRecordHoldsTheCredentialThatSucceeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		used        *pullcred.Used // what credential injection says it pulled with, after the request's own was refused
		wantNode    bool
		wantAccount bool
		wantHash    bool
	}{
		{"the request's credential refused, a node-wide plugin's accepted: node-wide", &pullcred.Used{Provider: "ecr"}, true, false, false},
		{"the request's credential refused, a token plugin's accepted: the pod's account",
			&pullcred.Used{Provider: "tp", ServiceAccount: &pullcred.ServiceAccount{Namespace: "ns", Name: "builder", UID: "sa-1"}}, false, true, false},
		{"the request's credential accepted: its hash", nil, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			if tc.used != nil {
				// The kubelet sends bob's credential; injection retries with
				// the plugin's (alice's) when the registry refuses it.
				s.node.allowed["registry.test/team-a/app"]["bob:b-pw"] = false
				s.credentials = pluginPull("alice:a-pw", *tc.used)
				s.restart(t, decision.NeverVerifyPreloadedImages)
			}
			_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("bob:b-pw"), SandboxConfig: podBOwn.sandbox()}, s.runtimePull)
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

// claimingTries is a sequence of tries that says a try succeeded whatever
// it was answered: no real credential injection does, but the record must
// rest on the registry's word, not on the sequence's.
type claimingTries struct{ req *runtimeapi.PullImageRequest }

func (c claimingTries) All(context.Context) iter.Seq[*runtimeapi.PullImageRequest] {
	return func(yield func(*runtimeapi.PullImageRequest) bool) { yield(c.req) }
}
func (claimingTries) Answer(error)                   {}
func (claimingTries) Result() (pullcred.Used, error) { return pullcred.Used{}, nil }

type claimingCredentials struct{}

func (claimingCredentials) Tries(req *runtimeapi.PullImageRequest) pullcred.Tries {
	return claimingTries{req}
}

func TestASuccessTheRegistryDidNotVerifyIsNoSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.credentials, s.checked = claimingCredentials{}, true
	s.restart(t, decision.NeverVerifyPreloadedImages)
	// bob's credential is refused at the registry; the sequence says it
	// succeeded anyway.
	s.node.allowed["registry.test/team-a/app"]["bob:b-pw"] = false
	_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("bob:b-pw"), SandboxConfig: podBOwn.sandbox()}, s.runtimePull)
	if err == nil {
		t.Fatal("a pull the registry refused was answered because the tries said it succeeded")
	}
	if rec, err := s.store.Get(refApp); err == nil && len(rec.CredentialMapping["registry.test/team-a/app"].KubernetesSecrets) > 0 {
		t.Errorf("bob's refused credential was recorded: %+v", rec.CredentialMapping)
	}
}
