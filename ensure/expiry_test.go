package ensure_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// TestRecordExpiry: with a maximum record age, a verified credential is
// re-used until it is that old, then verified again against the registry
// (IfNotPresent) or refused (Never); a verification refreshes it. Without
// one nothing expires, as in the kubelet.
func TestRecordExpiry(t *testing.T) {
	t.Parallel()
	type step struct {
		after      time.Duration // the clock moves this much first
		pod        pod
		image      string
		pullPolicy string
		want       kubeletResult
		requests   int
	}
	for _, tc := range []struct {
		name   string
		expiry *decision.Expiry
		steps  []step
	}{
		{
			name:   "no maximum age: a credential verified once is re-used for ever",
			expiry: nil,
			steps: []step{
				{0, podA, private, "IfNotPresent", running, 1},
				{1000 * time.Hour, podA2, private, "IfNotPresent", running, 0},
			},
		},
		{
			name:   "within the maximum age the credential is re-used; past it, verified again once, then re-used",
			expiry: &decision.Expiry{Default: time.Hour},
			steps: []step{
				{0, podA, private, "IfNotPresent", running, 1},
				{59 * time.Minute, podA2, private, "IfNotPresent", running, 0},
				{2 * time.Minute, podA2, private, "IfNotPresent", running, 1},
				{time.Minute, pod{uid: "a3", creds: podA.creds}, private, "IfNotPresent", running, 0},
			},
		},
		{
			name:   "past the maximum age a Never pod is refused, an IfNotPresent pod verifies again",
			expiry: &decision.Expiry{Default: time.Hour},
			steps: []step{
				{0, podA, private, "IfNotPresent", running, 1},
				{2 * time.Hour, podA2, private, "Never", errNeverPull, 0},
				{0, podA2, private, "IfNotPresent", running, 1},
			},
		},
		{
			name:   "a repository pattern overrides the default age",
			expiry: &decision.Expiry{Default: 100 * time.Hour, ByRepository: []decision.RepositoryAge{{Pattern: "registry.test/team-a", MaxAge: time.Minute}}},
			steps: []step{
				{0, podA, private, "IfNotPresent", running, 1},
				{2 * time.Minute, podA2, private, "IfNotPresent", running, 1},
			},
		},
		{
			name:   "an anonymous pull expires too: every pod then pulls once more",
			expiry: &decision.Expiry{Default: time.Hour},
			steps: []step{
				{0, podB, public, "IfNotPresent", running, 1},
				{30 * time.Minute, pod{uid: "c"}, public, "Never", running, 0},
				{time.Hour, pod{uid: "c2"}, public, "Never", errNeverPull, 0},
				{0, pod{uid: "c3"}, public, "IfNotPresent", running, 1},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			s.guard.SetExpiry(tc.expiry)
			for i, st := range tc.steps {
				s.clock.Step(st.after)
				before := s.node.registryRequests()
				if got := s.start(st.pod, st.image, st.pullPolicy); got != st.want {
					t.Errorf("step %d (pod %s, %s): %s, want %s", i, st.pod.uid, st.pullPolicy, got, st.want)
				}
				if n := s.node.registryRequests() - before; n != st.requests {
					t.Errorf("step %d (pod %s): %d registry requests, want %d", i, st.pod.uid, n, st.requests)
				}
			}
		})
	}

	t.Run("a credential verified before ages were kept is verified again where an age applies", func(t *testing.T) {
		t.Parallel()
		store, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.store = store
		s.restart(t, decision.NeverVerifyPreloadedImages)
		s.node.preload(private, refApp)
		// The record an older version wrote: A's hash, no verification time.
		rec := &ensure.Record{ImageRef: refApp, LastUpdatedTime: metav1.NewTime(s.clock.Now()), CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{
			"registry.test/team-a/app": {KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{{CredentialHash: store.HashAuth(ensure.Auth{Username: "alice", Password: "a-pw"})}}}}}
		if err := store.PutRecords([]*ensure.Record{rec}); err != nil {
			t.Fatal(err)
		}
		before := s.node.registryRequests()
		if got := s.start(podA2, private, "IfNotPresent"); got != running || s.node.registryRequests()-before != 0 {
			t.Fatalf("with no maximum age: %s, %d requests; want a re-use", got, s.node.registryRequests()-before)
		}
		s.guard.SetExpiry(&decision.Expiry{Default: 1000 * time.Hour})
		before = s.node.registryRequests()
		if got := s.start(pod{uid: "a3", creds: podA.creds}, private, "IfNotPresent"); got != running || s.node.registryRequests()-before != 1 {
			t.Errorf("with a maximum age: %s, %d requests; want one verification", got, s.node.registryRequests()-before)
		}
		if log := s.log.String(); !strings.Contains(log, "maximum record age") {
			t.Errorf("the operator's log does not say the record expired:\n%s", log)
		}
	})
}

// TestAVerificationTimeInTheFutureIsNotFresh: a clock that ran ahead and
// was corrected leaves verification times in the future; such a time
// counts as expired (the credential is verified again), not as fresh for
// as long as the clock was wrong, and the operator is told once.
func TestAVerificationTimeInTheFutureIsNotFresh(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.guard.SetExpiry(&decision.Expiry{Default: time.Hour})
	s.clock.Step(24 * time.Hour) // the clock runs a day ahead
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("tenant A's pull: %s", got)
	}
	s.clock.Step(-24 * time.Hour) // and is corrected
	for i, p := range []pod{podA2, {uid: "a3", creds: podA.creds}} {
		before := s.node.registryRequests()
		if got := s.start(p, private, "IfNotPresent"); got != running {
			t.Fatalf("pod %d: %s", i, got)
		}
		// The first verifies again (its record's time is refreshed to now);
		// the second re-uses that fresh verification.
		if n, want := s.node.registryRequests()-before, 1-i; n != want {
			t.Errorf("pod %d: %d registry requests, want %d", i, n, want)
		}
	}
	if n := strings.Count(s.log.String(), "verification time in the future"); n != 1 {
		t.Errorf("the operator's log says %d times that a verification time is in the future, want once:\n%s", n, s.log.String())
	}
}
