package ensure_test

import (
	"context"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// TestTheDeciderAloneDecidesAsTheGuard: records explain with no daemon
// runs the core on the database file; its decision for every image and
// pod is the daemon's, grants aside (it says it does not know them).
func TestTheDeciderAloneDecidesAsTheGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, name := range decision.Policies {
		policy := decision.PolicyName(name)
		var allow []string
		if policy == decision.NeverVerifyAllowlistedImages {
			allow = []string{"registry.test/public/*"}
		}
		s := newSetup(t, policy, allow...)
		s.node.preload(public, refTool)
		s.start(podA, private, "IfNotPresent") // A pulls the private image with its secret
		p, err := decision.NewPolicy(policy, allow)
		if err != nil {
			t.Fatal(err)
		}
		core, err := ensure.NewDecider(s.store, p, ensure.CRIRuntime(s.node, s.node), ensure.DeciderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range []string{private, public, refApp, "registry.test/absent:v1"} {
			for _, uid := range []string{"", podA.uid, podB.uid} {
				want, err := s.guard.Explain(ctx, img, uid)
				if err != nil {
					t.Fatal(err)
				}
				got, err := core.Explain(ctx, img, uid)
				if err != nil {
					t.Fatal(err)
				}
				if got.GrantsKnown || !want.GrantsKnown {
					t.Errorf("%s: grants known: core %v, guard %v", policy, got.GrantsKnown, want.GrantsKnown)
				}
				if got.NeedsVerification != want.NeedsVerification || got.Rule != want.Rule || got.Result != want.Result || got.ImageRef != want.ImageRef || got.Repository != want.Repository {
					t.Errorf("%s, %s, pod %q: the core says %+v, the guard %+v", policy, img, uid, got, want)
				}
			}
		}
	}
}

// TestTheDeciderTakesItsExpiryFromItsConstructor: records explain and
// show --ages with no daemon decide under the configuration's maximum
// record age, given to NewDecider, nothing set afterwards.
func TestTheDeciderTakesItsExpiryFromItsConstructor(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	p, err := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		expiry *decision.Expiry
	}{
		{"no maximum age", nil},
		{"a maximum age", &decision.Expiry{Default: time.Hour}},
	} {
		core, err := ensure.NewDecider(s.store, p, ensure.CRIRuntime(s.node, s.node), ensure.DeciderOptions{Expiry: tc.expiry})
		if err != nil {
			t.Fatal(err)
		}
		if got := core.Expiry(); got != tc.expiry {
			t.Errorf("%s: the decider decides under %v, want %v", tc.name, got, tc.expiry)
		}
	}
}
