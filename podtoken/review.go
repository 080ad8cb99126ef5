package podtoken

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// Reviewer decides whether a bearer token may read this node's metrics,
// asking the API as the kubelet does for its own /metrics: a TokenReview
// says who the token is, a SubjectAccessReview whether that user may get
// nodes/metrics of this node. The proxy's identity needs to create both
// (the node's identity may). Answers are cached by the token's SHA-256,
// never the token: allowed for 5 minutes, denied for 30 seconds, as the
// kubelet's webhook caches.
type Reviewer struct {
	authn, authz *rest.RESTClient
	node         string
	now          func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]review
}

type review struct {
	user    string
	allowed bool
	until   time.Time
}

const (
	allowedTTL = 5 * time.Minute
	deniedTTL  = 30 * time.Second
	// maxReviews bounds the cache: a client trying many tokens cannot
	// grow it without bound.
	maxReviews = 1024
)

// NewReviewer returns a Reviewer of the API at cfg for node.
func NewReviewer(cfg *rest.Config, node string) (*Reviewer, error) {
	client := func(gv schema.GroupVersion, add func(*runtime.Scheme) error) (*rest.RESTClient, error) {
		scheme := runtime.NewScheme()
		if err := add(scheme); err != nil {
			return nil, err
		}
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = "/apis"
		c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
		return rest.RESTClientFor(c)
	}
	authn, err := client(authenticationv1.SchemeGroupVersion, authenticationv1.AddToScheme)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	authz, err := client(authorizationv1.SchemeGroupVersion, authorizationv1.AddToScheme)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Reviewer{authn: authn, authz: authz, node: node, now: time.Now, cache: map[[32]byte]review{}}, nil
}

// Allowed reports who token is ("" when it authenticates as nobody) and
// whether it may read the node's metrics. An error means the API could not
// say: the caller refuses.
func (r *Reviewer) Allowed(ctx context.Context, token string) (user string, allowed bool, err error) {
	key := sha256.Sum256([]byte(token))
	now := r.now()
	r.mu.Lock()
	if c, ok := r.cache[key]; ok && now.Before(c.until) {
		r.mu.Unlock()
		return c.user, c.allowed, nil
	}
	r.mu.Unlock()

	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if err := r.authn.Post().Resource("tokenreviews").Body(tr).Do(ctx).Into(tr); err != nil {
		return "", false, fmt.Errorf("TokenReview: %w", err)
	}
	if tr.Status.Authenticated {
		u := tr.Status.User
		extra := map[string]authorizationv1.ExtraValue{}
		for k, v := range u.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, Groups: u.Groups, UID: u.UID, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Subresource: "metrics", Name: r.node},
		}}
		if err := r.authz.Post().Resource("subjectaccessreviews").Body(sar).Do(ctx).Into(sar); err != nil {
			return "", false, fmt.Errorf("SubjectAccessReview: %w", err)
		}
		user, allowed = u.Username, sar.Status.Allowed
	}
	ttl := deniedTTL
	if allowed {
		ttl = allowedTTL
	}
	r.mu.Lock()
	if len(r.cache) >= maxReviews {
		clear(r.cache)
	}
	r.cache[key] = review{user: user, allowed: allowed, until: now.Add(ttl)}
	r.mu.Unlock()
	return user, allowed, nil
}
