package podtoken_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
)

// heldFirstGet is an API whose first service account GET is served at
// once and answered only once release is closed: a GET slowed on its way
// back (a busy API server, client-side throttling, a congested node).
type heldFirstGet struct {
	podtoken.API
	held            atomic.Bool
	served, release chan struct{}
}

func (h *heldFirstGet) GetServiceAccount(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	sa, err := h.API.GetServiceAccount(ctx, ns, name)
	if h.held.CompareAndSwap(false, true) {
		close(h.served)
		<-h.release
	}
	return sa, err
}

// TestRecentServiceAccountNeverAnswersFromBeforeALiveRead: a GET of
// RecentServiceAccount that began before a live read (CreateContainer's,
// a token plugin's) and is answered after it must not make
// RecentServiceAccount answer with what the account was before that live
// read: threat row 56 says a live read that finds the account gone drops
// the kept read, and that the refused pod's retry, after that live read,
// is hidden and pulls. Under a pod-start storm (the case 62b55e4 is for)
// a GET slower than the live read is the ordinary case.
func TestRecentServiceAccountNeverAnswersFromBeforeALiveRead(t *testing.T) {
	t.Parallel()
	const ns, name = "team-a", "builder"
	for _, tc := range []struct {
		name string
		// change is what happens to the account after the slow GET was
		// served and before the live read.
		change func(t *testing.T, api *tokenAPI)
		// afterWindow: the caller comes once the live read is older than
		// AccountTTL, while the slow GET is still out; else it comes after
		// the slow GET was answered, within the window of the live read.
		afterWindow bool
		wantUID     string // "" : NotFound
	}{
		{
			name:    "a GET begun before a live read that found the account re-created, answered after it, does not bring the old UID back",
			change:  recreateAccount(ns, name, "sa-2"),
			wantUID: "sa-2",
		},
		{
			name:   "a GET begun before a live read that found the account deleted, answered after it, does not bring the account back",
			change: deleteAccount(ns, name),
		},
		{
			name:        "a caller that comes after a live read found the account re-created is not answered by a GET begun before that read",
			change:      recreateAccount(ns, name, "sa-2"),
			afterWindow: true,
			wantUID:     "sa-2",
		},
		{
			name:        "a caller that comes after a live read found the account deleted is not answered by a GET begun before that read",
			change:      deleteAccount(ns, name),
			afterWindow: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			api := newTokenAPI(testAccount(ns, name, "sa-1"))

			// The first GET is served at once (the API server reads the
			// account as it is then) and its answer is held until release.
			served, release := make(chan struct{}), make(chan struct{})
			held := &heldFirstGet{API: podtokentest.API(api.client), served: served, release: release}
			src := podtoken.New(held, "node-a", podtoken.Options{Clock: api.clock}) // AccountTTL: the default, 5s

			// ImageStatus's look: a RecentServiceAccount whose GET is slow.
			slow := make(chan struct{})
			go func() {
				defer close(slow)
				src.RecentServiceAccount(ctx, ns, name)
			}()
			<-served

			tc.change(t, api)
			api.clock.Step(time.Second)
			// CreateContainer's live read.
			live, liveErr := src.ServiceAccount(ctx, ns, name)
			if tc.wantUID == "" && !apierrors.IsNotFound(liveErr) {
				t.Fatalf("the live read got %v, %v; want NotFound", live, liveErr)
			}
			if tc.wantUID != "" && (liveErr != nil || string(live.UID) != tc.wantUID) {
				t.Fatalf("the live read got %v, %v; want UID %s", live, liveErr, tc.wantUID)
			}

			var sa *corev1.ServiceAccount
			var err error
			if tc.afterWindow {
				// The kubelet's retry of the refused pod, its back-off later:
				// the live read is past the window, the slow GET still out.
				api.clock.Step(6 * time.Second)
				done := make(chan struct{})
				go func() {
					defer close(done)
					sa, err = src.RecentServiceAccount(ctx, ns, name)
				}()
				time.Sleep(100 * time.Millisecond) // let it join the flight
				close(release)
				<-done
				<-slow
			} else {
				close(release)
				<-slow
				sa, err = src.RecentServiceAccount(ctx, ns, name)
			}
			switch {
			case tc.wantUID == "" && !apierrors.IsNotFound(err):
				t.Errorf("RecentServiceAccount after the live read found the account deleted: %v (UID %v), %v; want NotFound",
					sa != nil, uidOf(sa), err)
			case tc.wantUID != "" && (err != nil || string(sa.UID) != tc.wantUID):
				t.Errorf("RecentServiceAccount after the live read found UID %s: UID %v, %v; want %s",
					tc.wantUID, uidOf(sa), err, tc.wantUID)
			}
		})
	}
}

func uidOf(sa *corev1.ServiceAccount) string {
	if sa == nil {
		return "<none>"
	}
	return string(sa.UID)
}

func deleteAccount(ns, name string) func(*testing.T, *tokenAPI) {
	return func(t *testing.T, api *tokenAPI) {
		t.Helper()
		if err := api.client.CoreV1().ServiceAccounts(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func recreateAccount(ns, name, uid string) func(*testing.T, *tokenAPI) {
	return func(t *testing.T, api *tokenAPI) {
		t.Helper()
		deleteAccount(ns, name)(t, api)
		if _, err := api.client.CoreV1().ServiceAccounts(ns).Create(context.Background(), testAccount(ns, name, uid), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
