package ensure_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

// fakePods is the Kubernetes API as the guard reads it, held in maps: the
// agreement test needs a different set of waiting pods per case, with no
// informer to wait for.
type fakePods struct {
	pods     []*corev1.Pod
	secrets  map[string]*corev1.Secret         // namespace/name
	accounts map[string]*corev1.ServiceAccount // namespace/name
	// recent, when set, is what RecentServiceAccount answers (a read from
	// a few seconds before); else it answers as ServiceAccount.
	recent map[string]*corev1.ServiceAccount
}

func (f *fakePods) PodsOnNode() []*corev1.Pod { return f.pods }

func (f *fakePods) Pod(_ context.Context, ns, name, uid string) (*corev1.Pod, error) {
	for _, p := range f.pods {
		if p.Namespace == ns && p.Name == name && string(p.UID) == uid {
			return p, nil
		}
	}
	return nil, fmt.Errorf("pod %s/%s not found", ns, name)
}

// CachedPod is Pod without an error: the fake's maps are its informer.
func (f *fakePods) CachedPod(ns, name, uid string) *corev1.Pod {
	p, _ := f.Pod(context.Background(), ns, name, uid)
	return p
}

func (f *fakePods) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s := f.secrets[ns+"/"+name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("secret %s/%s not found", ns, name)
}

func (f *fakePods) ServiceAccount(_ context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	if sa := f.accounts[ns+"/"+name]; sa != nil {
		return sa, nil
	}
	return nil, fmt.Errorf("service account %s/%s not found", ns, name)
}

func (f *fakePods) RecentServiceAccount(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	if f.recent == nil {
		return f.ServiceAccount(ctx, ns, name)
	}
	if sa := f.recent[ns+"/"+name]; sa != nil {
		return sa, nil
	}
	return nil, fmt.Errorf("service account %s/%s not found", ns, name)
}

// annotatedAccounts is the token plugins as configured: a service account
// with the role annotation may re-use what it pulled.
type annotatedAccounts struct{}

func (annotatedAccounts) ServiceAccountMayPull(_ string, sa *corev1.ServiceAccount) (bool, string) {
	_, ok := sa.Annotations[roleAnnotation]
	return ok, "the role annotation"
}

// TestImageStatusAndCreateContainerAlwaysAgree: whatever the policy, how
// the image's record came to be, how old its verification is, and which
// pod waits for it, an image ImageStatus shows a pod (through the same
// filter the proxy applies before the guard sees the call) is an image
// CreateContainer lets that pod use; an image CreateContainer would refuse
// is hidden, so that the kubelet pulls (IfNotPresent) or reports
// ErrImageNeverPull (Never) instead of a pod stuck at CreateContainer.
// One pod waits at a time: while an entitled Never pod waits, ImageStatus
// shows the image to every waiting pod by design (threat 9 of
// docs/threat-model.md), and another tenant's is refused at create. The
// account ImageStatus reads is the one CreateContainer reads live; for
// the few seconds a read is reused, see
// TestImageStatusShowsByARecentReadAndCreateContainerDecidesLive.
func TestImageStatusAndCreateContainerAlwaysAgree(t *testing.T) {
	t.Parallel()
	const repo = "registry.test/team-a/app"
	t0 := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	policies := []struct {
		name      decision.PolicyName
		allowlist []string
	}{
		{decision.NeverVerify, nil},
		{decision.NeverVerifyPreloadedImages, nil},
		{decision.NeverVerifyAllowlistedImages, []string{"registry.test/public"}},
		{decision.AlwaysVerify, nil},
	}
	// kinds are how the image's record came to be; each writes it.
	kinds := []struct {
		name   string
		record func(s ensure.RecordStore, at time.Time) error
	}{
		{"preloaded (no record)", func(ensure.RecordStore, time.Time) error { return nil }},
		{"pulled with no verified credential", func(s ensure.RecordStore, at time.Time) error {
			return s.RecordPull(refApp, repo, ensure.Credential{}, "", at, nil)
		}},
		{"pulled with a pull secret (its coordinates)", func(s ensure.RecordStore, at time.Time) error {
			return s.RecordPull(refApp, repo, ensure.Credential{Hash: s.HashAuth(ensure.Auth{Username: "alice", Password: "a-pw"}),
				Secret: &ensure.SecretRef{Namespace: "ns-a", Name: "sec-a", UID: "sec-a-uid"}}, "", at, nil)
		}},
		{"pulled with a credential known by its hash only", func(s ensure.RecordStore, at time.Time) error {
			return s.RecordPull(refApp, repo, ensure.Credential{Hash: s.HashAuth(ensure.Auth{Username: "alice", Password: "a-pw"})}, "", at, nil)
		}},
		{"pulled with a service account", func(s ensure.RecordStore, at time.Time) error {
			return s.RecordPull(refApp, repo, ensure.Credential{ServiceAccount: &ensure.ServiceAccount{Namespace: "ns-a", Name: "sa-a", UID: "sa-a-uid"}}, "", at, nil)
		}},
		{"pulled anonymously or with node credentials", func(s ensure.RecordStore, at time.Time) error {
			return s.RecordPull(refApp, repo, ensure.Credential{Node: true}, "", at, nil)
		}},
	}
	ages := []struct {
		name     string
		expiry   *decision.Expiry
		verified time.Duration // when the record was written, from the decision's now
	}{
		{"no maximum age", nil, -1000 * time.Hour},
		{"verified within the maximum age", &decision.Expiry{Default: time.Hour}, -time.Minute},
		{"verified past the maximum age", &decision.Expiry{Default: time.Hour}, -2 * time.Hour},
		{"verified in the future (a clock set back)", &decision.Expiry{Default: time.Hour}, 30 * time.Minute},
		{"past the age of its repository's pattern", &decision.Expiry{Default: 100 * time.Hour, ByRepository: []decision.RepositoryAge{{Pattern: "registry.test/team-a", MaxAge: time.Minute}}}, -time.Hour},
	}
	type waiter struct {
		name  string
		pod   *corev1.Pod
		noAPI bool // the proxy runs without the kubernetes section
	}
	entitledPod := func(policy corev1.PullPolicy) *corev1.Pod {
		p := policyPod("ns-a", "tenant-a", "uid-a", "sa-a", private, policy, "sec-a")
		return p
	}
	otherPod := func(policy corev1.PullPolicy) *corev1.Pod {
		return policyPod("ns-b", "tenant-b", "uid-b", "default", private, policy)
	}
	waiters := []waiter{
		{name: "tenant A's pod (IfNotPresent)", pod: entitledPod(corev1.PullIfNotPresent)},
		{name: "tenant A's pod (Never)", pod: entitledPod(corev1.PullNever)},
		{name: "tenant B's pod (IfNotPresent)", pod: otherPod(corev1.PullIfNotPresent)},
		{name: "tenant B's pod (Never)", pod: otherPod(corev1.PullNever)},
		{name: "tenant A's pod, no API", pod: entitledPod(corev1.PullNever), noAPI: true},
		{name: "tenant B's pod, no API", pod: otherPod(corev1.PullNever), noAPI: true},
	}
	secretA := pullSecret("ns-a", "sec-a", "registry.test", "alice:a-pw")
	secretA.UID = "sec-a-uid"
	saA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "sa-a", UID: types.UID("sa-a-uid"), Annotations: map[string]string{roleAnnotation: "puller"}}}
	saB := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-b", Name: "default", UID: types.UID("sa-b-uid")}}

	cases, shownCount := 0, 0
	for _, p := range policies {
		for _, k := range kinds {
			for _, a := range ages {
				for _, w := range waiters {
					name := fmt.Sprintf("%s, %s, %s, %s", p.name, k.name, a.name, w.name)
					cases++
					clock := testclock.NewFakeClock(t0)
					store := ensuretest.NewMemoryStore()
					if err := k.record(store, t0.Add(a.verified)); err != nil {
						t.Fatalf("%s: writing the record: %v", name, err)
					}
					node := newFakeNode()
					node.preload(private, refApp)
					policy, err := decision.NewPolicy(p.name, p.allowlist)
					if err != nil {
						t.Fatal(err)
					}
					opts := ensure.GuardOptions{Clock: clock, Logger: slog.New(slog.DiscardHandler)}
					if !w.noAPI {
						opts.Pods = &fakePods{
							pods:     []*corev1.Pod{w.pod},
							secrets:  map[string]*corev1.Secret{"ns-a/sec-a": secretA},
							accounts: map[string]*corev1.ServiceAccount{"ns-a/sa-a": saA, "ns-b/default": saB},
						}
						opts.Accounts = annotatedAccounts{}
					}
					g, err := ensure.NewGuard(store, policy, ensure.CRIRuntime(node, node), opts)
					if err != nil {
						t.Fatal(err)
					}
					g.SetExpiry(a.expiry)

					ctx := context.Background()
					statusReq := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}
					shown := true
					if g.WantsImageStatus(statusReq) { // the filter criproxy applies first
						st, err := g.ImageStatus(ctx, statusReq, func(ctx context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
							return node.ImageStatus(ctx, r)
						})
						if err != nil {
							t.Fatalf("%s: ImageStatus: %v", name, err)
						}
						shown = st.GetImage() != nil
					}
					_, createErr := g.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
						Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
						SandboxConfig: sandbox(w.pod.Namespace, w.pod.Name, string(w.pod.UID)),
					}, node.CreateContainer)
					if shown {
						shownCount++
					}
					if shown && createErr != nil {
						t.Errorf("%s: ImageStatus shows the image, but CreateContainer refuses it: %v", name, createErr)
					}
				}
			}
		}
	}
	// The table must exercise both answers, or it proves nothing.
	if shownCount == 0 || shownCount == cases {
		t.Fatalf("%d of %d cases shown: the table does not exercise both answers", shownCount, cases)
	}
	t.Logf("%d cases, %d shown", cases, shownCount)
}

// TestImageStatusShowsByARecentReadAndCreateContainerDecidesLive:
// ImageStatus decides whom to show an image to with a read of the waiting
// pods' service accounts of the last few seconds (RecentServiceAccount);
// CreateContainer decides with a live read. Within that window an account
// changed since the read may be shown the image by its old read; it is
// never let in by it.
func TestImageStatusShowsByARecentReadAndCreateContainerDecidesLive(t *testing.T) {
	t.Parallel()
	const repo = "registry.test/team-a/app"
	verified := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "sa-a", UID: "sa-a-uid", Annotations: map[string]string{roleAnnotation: "puller"}}}
	recreated := verified.DeepCopy()
	recreated.UID = "sa-a-new-uid"
	unannotated := verified.DeepCopy()
	unannotated.Annotations = nil
	for _, tc := range []struct {
		name         string
		recent, live *corev1.ServiceAccount
		wantShown    bool
		wantAdmitted bool
	}{
		{name: "an account unchanged since the read is shown the image and let in", recent: verified, live: verified, wantShown: true, wantAdmitted: true},
		{name: "an account re-created since the read (new UID) may be shown it by the old read, and is refused at create", recent: verified, live: recreated, wantShown: true},
		{name: "an account whose role annotation was removed since the read may be shown it, and is refused at create", recent: verified, live: unannotated, wantShown: true},
		{name: "an account deleted since the read may be shown it, and is refused at create", recent: verified, wantShown: true},
		{name: "an account re-created as the verified one since the read is hidden, and let in at create", recent: recreated, live: verified, wantAdmitted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := ensuretest.NewMemoryStore()
			if err := store.RecordPull(refApp, repo, ensure.Credential{ServiceAccount: &ensure.ServiceAccount{Namespace: "ns-a", Name: "sa-a", UID: "sa-a-uid"}}, "", time.Now(), nil); err != nil {
				t.Fatal(err)
			}
			node := newFakeNode()
			node.preload(private, refApp)
			policy, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
			pod := policyPod("ns-a", "tenant-a", "uid-a", "sa-a", private, corev1.PullNever)
			pods := &fakePods{pods: []*corev1.Pod{pod}, accounts: map[string]*corev1.ServiceAccount{}, recent: map[string]*corev1.ServiceAccount{}}
			if tc.live != nil {
				pods.accounts["ns-a/sa-a"] = tc.live
			}
			pods.recent["ns-a/sa-a"] = tc.recent
			g, err := ensure.NewGuard(store, policy, ensure.CRIRuntime(node, node), ensure.GuardOptions{Logger: slog.New(slog.DiscardHandler), Pods: pods, Accounts: annotatedAccounts{}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			st, err := g.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, func(ctx context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
				return node.ImageStatus(ctx, r)
			})
			if err != nil {
				t.Fatal(err)
			}
			if shown := st.GetImage() != nil; shown != tc.wantShown {
				t.Errorf("ImageStatus shown %v, want %v", shown, tc.wantShown)
			}
			_, err = g.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
				Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
				SandboxConfig: sandbox("ns-a", "tenant-a", "uid-a"),
			}, node.CreateContainer)
			if admitted := err == nil; admitted != tc.wantAdmitted {
				t.Errorf("CreateContainer let the pod in: %v (%v), want %v", admitted, err, tc.wantAdmitted)
			}
			if !tc.wantAdmitted && status.Code(toStatus(err)) != codes.PermissionDenied {
				t.Errorf("CreateContainer: %v, want PermissionDenied", err)
			}
		})
	}
}
