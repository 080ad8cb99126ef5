package podtoken

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
)

// fakeReviewAPI answers TokenReviews (token "reader" is prometheus,
// "someone" is someone) and SubjectAccessReviews (prometheus may get
// nodes/metrics of node-a), counting the requests.
func fakeReviewAPI(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			json.NewDecoder(r.Body).Decode(&tr)
			switch tr.Spec.Token {
			case "reader":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "prometheus"}}
			case "someone":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "someone"}}
			}
			tr.Spec.Token = "" // the API does not echo it
			tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
			json.NewEncoder(w).Encode(&tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			json.NewDecoder(r.Body).Decode(&sar)
			a := sar.Spec.ResourceAttributes
			sar.Status.Allowed = sar.Spec.User == "prometheus" && a.Verb == "get" && a.Resource == "nodes" && a.Subresource == "metrics" && a.Name == "node-a"
			sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
			json.NewEncoder(w).Encode(&sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestReviewer(t *testing.T) {
	t.Parallel()
	srv, calls := fakeReviewAPI(t)
	r, err := NewReviewer(&rest.Config{Host: srv.URL}, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	for _, tc := range []struct {
		name, token, user string
		allowed           bool
	}{
		{"a user allowed to get this node's metrics", "reader", "prometheus", true},
		{"a user who is not", "someone", "someone", false},
		{"a token nobody is", "forged", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, allowed, err := r.Allowed(ctx, tc.token)
			if err != nil || user != tc.user || allowed != tc.allowed {
				t.Errorf("Allowed(%q) = %q, %v, %v; want %q, %v", tc.token, user, allowed, err, tc.user, tc.allowed)
			}
		})
	}
	before := calls.Load()
	r.Allowed(ctx, "reader")
	r.Allowed(ctx, "someone")
	if calls.Load() != before {
		t.Errorf("cached answers asked the API again")
	}
	now = now.Add(time.Minute) // past the denied TTL, within the allowed one
	r.Allowed(ctx, "reader")
	if calls.Load() != before {
		t.Errorf("an allowed answer was asked again within 5 minutes")
	}
	r.Allowed(ctx, "someone")
	if calls.Load() == before {
		t.Errorf("a denied answer was kept past 30 seconds")
	}
	for k := range r.cache {
		if string(k[:]) == "reader" || string(k[:]) == "someone" {
			t.Errorf("the cache holds a token")
		}
	}
	srv.Close()
	if _, _, err := r.Allowed(ctx, "new-token"); err == nil {
		t.Errorf("with the API down a new token got an answer")
	}
}
