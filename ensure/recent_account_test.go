package ensure_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
)

// slowFirstAccountGet is an API whose first service account GET is
// served at once and answered only once release is closed: ImageStatus's
// shared GET, slowed on its way back by a busy API server.
type slowFirstAccountGet struct {
	podtoken.API
	held            atomic.Bool
	served, release chan struct{}
}

// IsWatchListSemanticsUnSupported passes on what podtokentest's API
// says (the embedded interface does not carry it): client-go's fake
// clientset cannot stream the informer's initial list.
func (h *slowFirstAccountGet) IsWatchListSemanticsUnSupported() bool { return true }

func (h *slowFirstAccountGet) GetServiceAccount(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	sa, err := h.API.GetServiceAccount(ctx, ns, name)
	if h.held.CompareAndSwap(false, true) {
		close(h.served)
		<-h.release
	}
	return sa, err
}

// TestTheRetryOfAPodRefusedByALiveAccountReadIsHidden holds threat row 56's
// residual to its word: a pod shown an image by a read of its account
// from before a re-creation or deletion is refused at CreateContainer,
// and "its retry, after that live read, is hidden and pulls". Here
// ImageStatus's shared GET was served before the change and answered
// after CreateContainer's live read (a storm's busy API server).
func TestTheRetryOfAPodRefusedByALiveAccountReadIsHidden(t *testing.T) {
	t.Parallel()
	const repo = "registry.test/team-a/app"
	for _, tc := range []struct {
		name string
		// recreate: the account is re-created (new UID); else deleted.
		recreate bool
		// retryLater: the kubelet's retry comes once CreateContainer's live
		// read is older than the account window (its back-off is 10 s),
		// while ImageStatus's GET is still out; else after that GET.
		retryLater bool
	}{
		{name: "the retry of a pod whose account was deleted is hidden once CreateContainer's live read found it gone"},
		{name: "the retry of a pod whose account was re-created is hidden once CreateContainer's live read found the new UID", recreate: true},
		{name: "a retry a back-off later is hidden although ImageStatus's GET from before the deletion is still out", retryLater: true},
		{name: "a retry a back-off later is hidden although ImageStatus's GET from before the re-creation is still out", recreate: true, retryLater: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := ensuretest.NewMemoryStore()
			if err := store.RecordPull(refApp, repo, ensure.Credential{ServiceAccount: &ensure.ServiceAccount{Namespace: "ns-a", Name: "sa-a", UID: "sa-a-uid"}}, "", time.Now(), nil); err != nil {
				t.Fatal(err)
			}
			node := newFakeNode()
			node.preload(private, refApp)
			pod := policyPod("ns-a", "tenant-a", "uid-a", "sa-a", private, corev1.PullIfNotPresent)
			client := fake.NewClientset(pod, account("ns-a", "sa-a", "sa-a-uid"))
			api := &slowFirstAccountGet{API: podtokentest.API(client), served: make(chan struct{}), release: make(chan struct{})}
			clock := testclock.NewFakeClock(time.Now())
			src := podtoken.New(api, "node", podtoken.Options{Clock: clock}) // AccountTTL: the default, 5s
			sctx, cancel := context.WithCancel(ctx)
			src.Start(sctx)
			t.Cleanup(func() { cancel(); src.Wait() })
			if !src.WaitForSync(sctx) {
				t.Fatal("no sync")
			}
			policy, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
			g, err := ensure.NewGuard(store, policy, ensure.CRIRuntime(node, node), ensure.GuardOptions{Logger: slog.New(slog.DiscardHandler), Pods: src, Accounts: annotatedAccounts{}})
			if err != nil {
				t.Fatal(err)
			}
			imageStatus := func() bool {
				st, err := g.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, func(ctx context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
					return node.ImageStatus(ctx, r)
				})
				if err != nil {
					t.Error(err)
				}
				return st.GetImage() != nil
			}
			create := func() error {
				_, err := g.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
					Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
					SandboxConfig: sandbox("ns-a", "tenant-a", "uid-a"),
				}, node.CreateContainer)
				return err
			}

			// The kubelet's ImageStatus: its GET of the account is served now
			// and answered late.
			first := make(chan bool)
			go func() { first <- imageStatus() }()
			<-api.served

			sas := client.CoreV1().ServiceAccounts("ns-a")
			if err := sas.Delete(ctx, "sa-a", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.recreate {
				if _, err := sas.Create(ctx, account("ns-a", "sa-a", "sa-a-new-uid"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			clock.Step(time.Second)
			// The kubelet's CreateContainer (the image was, or will be, shown):
			// refused by its live read.
			if err := create(); status.Code(toStatus(err)) != codes.PermissionDenied {
				t.Fatalf("CreateContainer after the change: %v, want PermissionDenied", err)
			}

			var retryShown bool
			if tc.retryLater {
				clock.Step(10 * time.Second)
				retry := make(chan bool)
				go func() { retry <- imageStatus() }()
				time.Sleep(100 * time.Millisecond) // it joins the GET still out
				close(api.release)
				<-first
				retryShown = <-retry
			} else {
				close(api.release)
				<-first
				retryShown = imageStatus()
			}
			if retryShown {
				t.Errorf("the retry's ImageStatus shows the image after CreateContainer's live read refused the pod: it is refused again instead of pulling")
			}
			// Fail-closed still: the retry's CreateContainer is refused.
			if err := create(); status.Code(toStatus(err)) != codes.PermissionDenied {
				t.Fatalf("the retry's CreateContainer: %v, want PermissionDenied", err)
			}
		})
	}
}
