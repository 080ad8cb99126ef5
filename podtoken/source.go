package podtoken

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/internal/periodic"
)

// ErrPodMismatch is returned when the API's pod of that name is not the
// pod the runtime knows (another UID): it was deleted and re-created.
var ErrPodMismatch = errors.New("the pod's UID differs from the sandbox's")

// ErrPodNotOnNode is returned for a pod the API binds to another node: a
// sandbox on this node cannot be it, so nothing is read or requested in
// its name (the Node authorizer would refuse the node's identity anyway;
// this holds for any identity).
var ErrPodNotOnNode = errors.New("the pod is bound to another node")

// Options configure a Source.
type Options struct {
	Logger *slog.Logger
	Clock  clock.WithTicker
	// SecretTTL is how long a pull secret read for ImageStatus is reused.
	// Default 30s.
	SecretTTL time.Duration
	// AccountTTL is how long a service account read is reused by
	// RecentServiceAccount (ImageStatus's look at the pods waiting);
	// ServiceAccount always reads live. Default 5s.
	AccountTTL time.Duration
}

// Source is the API-side identity of the node's pods. It is safe for
// concurrent use once Start has been called.
type Source struct {
	client API
	node   string
	log    *slog.Logger
	clock  clock.WithTicker

	informer cache.SharedIndexInformer
	pods     corelisters.PodLister
	synced   func() bool
	running  sync.WaitGroup // the goroutines Start started

	minting singleflight.Group // one TokenRequest per pod, account and audience at a time
	reading singleflight.Group // one shared GET per account for RecentServiceAccount

	mu      sync.Mutex
	tokens  map[tokenKey]*token
	secrets map[types.NamespacedName]cachedSecret
	secTTL  time.Duration
	// accounts are the newest reads of service accounts, live or recent.
	accounts map[types.NamespacedName]readAccount
	saTTL    time.Duration
}

type tokenKey struct {
	podUID, saName, saUID, audience string
}

// flightKey is the key's string for the minting group. The parts are
// joined with NUL, which the API's names and UIDs never hold; the
// audience, which may hold anything, is last, so no two keys share one.
func (k tokenKey) flightKey() string {
	return k.podUID + "\x00" + k.saName + "\x00" + k.saUID + "\x00" + k.audience
}

type token struct {
	value     string
	refreshAt time.Time // 80% of its life, or 24h, whichever comes first
	expires   time.Time
}

// readAccount is what a GET of a service account that began at asked
// found: the account, or the error it failed with (account nil).
type readAccount struct {
	account *corev1.ServiceAccount
	err     error
	asked   time.Time
}

func (r readAccount) answer() (*corev1.ServiceAccount, error) {
	if r.account == nil {
		return nil, r.err
	}
	return r.account, nil
}

type cachedSecret struct {
	secret *corev1.Secret
	err    error
	until  time.Time
}

// New returns a Source for the pods of node.
func New(client API, node string, opts Options) *Source {
	s := &Source{client: client, node: node, log: opts.Logger, clock: opts.Clock, secTTL: opts.SecretTTL, saTTL: opts.AccountTTL,
		tokens: map[tokenKey]*token{}, secrets: map[types.NamespacedName]cachedSecret{}, accounts: map[types.NamespacedName]readAccount{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if s.secTTL <= 0 {
		s.secTTL = 30 * time.Second
	}
	if s.saTTL <= 0 {
		s.saTTL = 5 * time.Second
	}
	onNode := fields.OneTermEqualSelector("spec.nodeName", node).String()
	// The reflector streams the initial list (WatchList) unless the client
	// says it cannot (client-go's fake clientset, through podtokentest).
	s.informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = onNode
			return client.ListPods(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = onNode
			return client.WatchPods(ctx, o)
		},
	}, client), &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	s.pods = corelisters.NewPodLister(s.informer.GetIndexer())
	s.synced = s.informer.HasSynced
	return s
}

// Start starts the pod informer and the cleanup of expired tokens; both
// stop with ctx, and Wait waits until they have.
func (s *Source) Start(ctx context.Context) {
	s.running.Go(func() { s.informer.RunWithContext(ctx) })
	s.running.Go(func() { periodic.Every(ctx, time.Minute, func(context.Context) { s.dropExpired() }) })
}

// Wait returns once what Start started has stopped, after its ctx ended:
// no goroutine of the source outlives its owner (client-go's informer logs
// through klog's process-wide logger, which the next daemon of a test
// process replaces).
func (s *Source) Wait() { s.running.Wait() }

// WaitForSync waits until the informer has listed the node's pods, or ctx ends.
func (s *Source) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), s.synced)
}

// Pod returns the pod namespace/name whose UID is uid: from the informer,
// else with a GET (a pod the informer has not seen yet).
func (s *Source) Pod(ctx context.Context, namespace, name, uid string) (*corev1.Pod, error) {
	if p := s.CachedPod(namespace, name, uid); p != nil {
		return p, nil
	}
	p, err := s.client.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	if string(p.UID) != uid {
		return nil, fmt.Errorf("pod %s/%s has UID %s, the sandbox %s: %w", namespace, name, p.UID, uid, ErrPodMismatch)
	}
	if p.Spec.NodeName != s.node {
		return nil, fmt.Errorf("pod %s/%s is on node %q, this is %q: %w", namespace, name, p.Spec.NodeName, s.node, ErrPodNotOnNode)
	}
	return p, nil
}

// CachedPod is the pod namespace/name with UID uid as the informer holds
// it, never read from the API; nil when it holds no such pod (not synced,
// not on this node, another UID).
func (s *Source) CachedPod(namespace, name, uid string) *corev1.Pod {
	if !s.synced() {
		return nil
	}
	if p, err := s.pods.Pods(namespace).Get(name); err == nil && string(p.UID) == uid {
		return p
	}
	return nil
}

// PodsOnNode lists the node's pods the informer holds; nil before it synced.
func (s *Source) PodsOnNode() []*corev1.Pod {
	if !s.synced() {
		return nil
	}
	pods, _ := s.pods.List(labels.Everything())
	return pods
}

// ServiceAccount reads a service account, live: a deleted and re-created
// account must be seen with its new UID at once by what lets a pod use an
// image or gives it a credential. What it finds, or that it failed, also
// serves RecentServiceAccount.
func (s *Source) ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	return s.readAccountLive(ctx, types.NamespacedName{Namespace: namespace, Name: name}).answer()
}

// readAccountLive GETs the account and keeps what it found, or that it
// failed, unless a read that began later is kept already.
func (s *Source) readAccountLive(ctx context.Context, key types.NamespacedName) readAccount {
	r := readAccount{asked: s.clock.Now()}
	r.account, r.err = s.client.GetServiceAccount(ctx, key.Namespace, key.Name)
	if r.err != nil {
		r.account, r.err = nil, fmt.Errorf("service account %s: %w", key, r.err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.accounts[key]; !ok || !old.asked.After(r.asked) {
		s.accounts[key] = r
	}
	return r
}

// RecentServiceAccount returns a service account as a read that began in
// the last AccountTTL found it, else reads it, concurrent callers sharing
// one GET. It never answers from before a later read, live or not: a
// read that found the account changed or gone is what it answers from;
// a failure kept is not reused, the next call reads again. It is for
// ImageStatus's look at the pods waiting for an image, which only
// predicts: the CreateContainer that follows decides with a live read.
// Under a storm of pod starts it keeps one read per account and window
// instead of one per ImageStatus answer, each waiting for an API server
// busy with the storm.
func (s *Source) RecentServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	arrived := s.clock.Now()
	if r, ok := s.recentAccount(key); ok {
		return r.answer()
	}
	v, _, _ := s.reading.Do(key.String(), func() (any, error) {
		if r, ok := s.recentAccount(key); ok {
			return r, nil // another flight has just read it
		}
		return s.readAccountLive(ctx, key), nil
	})
	r := v.(readAccount)
	// The shared GET may have begun before a read kept since (a live one
	// that found the account re-created or gone), or, for a caller that
	// joined it late, before its window.
	if newer, ok := s.keptAccount(key); ok && newer.asked.After(r.asked) {
		r = newer
	}
	if arrived.Sub(r.asked) >= s.saTTL {
		return s.readAccountLive(ctx, key).answer()
	}
	return r.answer()
}

// recentAccount returns the kept read of key when it began within the
// window and found the account; a failure is not answered from.
func (s *Source) recentAccount(key types.NamespacedName) (readAccount, bool) {
	r, ok := s.keptAccount(key)
	if !ok || r.account == nil || s.clock.Since(r.asked) >= s.saTTL {
		return readAccount{}, false
	}
	return r, true
}

func (s *Source) keptAccount(key types.NamespacedName) (readAccount, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.accounts[key]
	return r, ok
}

// Token returns a token of the service account sa for audience, bound to
// pod, minting one when none is cached or the cached one is past 80% of
// its life (24h at most), as the kubelet's token manager does. Concurrent
// calls for one pod share one TokenRequest, so a pod's containers pulling
// at once do not mint several. The API refuses when sa's UID changed since
// it was read.
func (s *Source) Token(ctx context.Context, pod *corev1.Pod, sa *corev1.ServiceAccount, audience string) (string, error) {
	key := tokenKey{podUID: string(pod.UID), saName: sa.Name, saUID: string(sa.UID), audience: audience}
	if t := s.cachedToken(key); t != nil && s.clock.Now().Before(t.refreshAt) {
		return t.value, nil
	}
	v, err, _ := s.minting.Do(key.flightKey(), func() (any, error) {
		// Another flight may have just minted it.
		if t := s.cachedToken(key); t != nil && s.clock.Now().Before(t.refreshAt) {
			return t.value, nil
		}
		return s.mint(ctx, key, pod, sa)
	})
	if err != nil {
		return "", err
	}
	return v.(string), nil
}

func (s *Source) cachedToken(key tokenKey) *token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[key]
}

func (s *Source) mint(ctx context.Context, key tokenKey, pod *corev1.Pod, sa *corev1.ServiceAccount) (string, error) {
	now := s.clock.Now()
	tr, err := s.client.CreateToken(ctx, pod.Namespace, sa.Name, &authenticationv1.TokenRequest{
		// The API refuses the request if the account's UID is no longer this one.
		ObjectMeta: metav1.ObjectMeta{UID: sa.UID},
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{key.audience},
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			},
		},
	})
	if err != nil {
		if t := s.cachedToken(key); t != nil && now.Before(t.expires) {
			// As the kubelet: keep serving the old token while it is valid.
			s.log.Warn("refreshing a service account token failed; using the current one", "serviceAccount", pod.Namespace+"/"+sa.Name, "err", err)
			return t.value, nil
		}
		return "", fmt.Errorf("token for service account %s/%s (audience %q, pod %s): %w", pod.Namespace, sa.Name, key.audience, pod.Name, err)
	}
	exp := tr.Status.ExpirationTimestamp.Time
	refresh := now.Add(exp.Sub(now) * 8 / 10)
	if d := now.Add(24 * time.Hour); refresh.After(d) {
		refresh = d
	}
	s.mu.Lock()
	s.tokens[key] = &token{value: tr.Status.Token, refreshAt: refresh, expires: exp}
	s.mu.Unlock()
	return tr.Status.Token, nil
}

// dropExpired forgets expired tokens, secrets and account reads.
func (s *Source) dropExpired() {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.tokens {
		if !now.Before(t.expires) {
			delete(s.tokens, k)
		}
	}
	for k, c := range s.secrets {
		if !now.Before(c.until) {
			delete(s.secrets, k)
		}
	}
	for k, r := range s.accounts {
		if now.Sub(r.asked) >= s.saTTL {
			delete(s.accounts, k)
		}
	}
}

// Secret reads a secret, reusing a read of the last SecretTTL. A secret
// that does not exist is an error wrapping the API's NotFound.
func (s *Source) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	now := s.clock.Now()
	s.mu.Lock()
	c, ok := s.secrets[key]
	s.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.secret, c.err
	}
	sec, err := s.client.GetSecret(ctx, namespace, name)
	if err != nil {
		err = fmt.Errorf("secret %s/%s: %w", namespace, name, err)
		if !apierrors.IsNotFound(err) {
			return nil, err // not cached: try again next time
		}
	}
	s.mu.Lock()
	s.secrets[key] = cachedSecret{secret: sec, err: err, until: now.Add(s.secTTL)}
	s.mu.Unlock()
	return sec, err
}
