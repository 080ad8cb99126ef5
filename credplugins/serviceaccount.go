package credplugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// Identity is what service-account-token providers (KEP-4412) need of the
// Kubernetes API; podtoken.Source is the real one.
type Identity interface {
	// Pod returns the pod namespace/name with UID uid, or an error.
	Pod(ctx context.Context, namespace, name, uid string) (*corev1.Pod, error)
	// ServiceAccount reads a service account, live.
	ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)
	// Token returns a token of sa for audience, bound to pod.
	Token(ctx context.Context, pod *corev1.Pod, sa *corev1.ServiceAccount, audience string) (string, error)
}

// PodRef is a pod as the CRI's sandbox metadata names it.
type PodRef struct {
	Namespace, Name, UID string
}

// ErrNoServiceAccountCredential marks a token provider that was not run
// for a pod, by its configuration: no pod identity, no service account, a
// required annotation missing. It is not a failure of the plugin.
var ErrNoServiceAccountCredential = errors.New("not run for this pod")

// saRequest is what a token provider runs with for one pod.
type saRequest struct {
	token       string
	annotations map[string]string
	account     *pullcred.ServiceAccount // nil when run without a token
	cacheKey    string                   // the extra cache key part
}

// flightKey is the key that merges concurrent runs of the plugin for image,
// as the kubelet's (pkg/credentialprovider/plugin/plugin.go,
// generateSingleFlightKey: image, token hash, annotations): one run per
// token. The service account cache key alone would let two pods of one
// account share a run made with the first pod's token, and the second pod
// would get the credential minted for another pod's token even where the
// plugin answers cacheDuration 0 (KEP-4412's way to keep credentials from
// being shared across pods). The cache key carries the annotations, and
// the account, which the token implies. It is computed on a cache miss
// only: a hit needs no hash.
func (r saRequest) flightKey(image string) string {
	tokenHash := ""
	if r.token != "" {
		tokenHash = hashToken(r.token)
	}
	return authcache.FlightKey(image, r.cacheKey, tokenHash)
}

// serviceAccountRequest prepares a token provider's run for pod, as the
// kubelet does (pkg/credentialprovider/plugin/plugin.go): the pod's
// service account, the required and optional annotations it asks for, a
// token bound to the pod, and the cache key that goes with them.
func (p *plugin) serviceAccountRequest(ctx context.Context, pod *PodRef) (saRequest, error) {
	ta := p.cfg.TokenAttributes
	require := ta.RequireServiceAccount != nil && *ta.RequireServiceAccount
	if pod == nil || pod.UID == "" {
		if require {
			return saRequest{}, fmt.Errorf("plugin %s needs the pod's service account and the pull names no pod: %w", p.cfg.Name, ErrNoServiceAccountCredential)
		}
		return saRequest{}, nil
	}
	if p.identity == nil {
		return saRequest{}, fmt.Errorf("plugin %s needs the Kubernetes API (tokenAttributes) and none is configured", p.cfg.Name)
	}
	kpod, err := p.identity.Pod(ctx, pod.Namespace, pod.Name, pod.UID)
	if err != nil {
		return saRequest{}, err
	}
	saName := kpod.Spec.ServiceAccountName
	if saName == "" {
		if require {
			return saRequest{}, fmt.Errorf("plugin %s: pod %s/%s has no service account: %w", p.cfg.Name, pod.Namespace, pod.Name, ErrNoServiceAccountCredential)
		}
		return saRequest{}, nil
	}
	sa, err := p.identity.ServiceAccount(ctx, pod.Namespace, saName)
	if err != nil {
		return saRequest{}, err
	}
	if k := missingAnnotation(ta, sa); k != "" {
		// A required annotation is how a workload opts in: without it the
		// plugin is not run.
		return saRequest{}, fmt.Errorf("plugin %s: service account %s/%s lacks the required annotation %s: %w", p.cfg.Name, sa.Namespace, sa.Name, k, ErrNoServiceAccountCredential)
	}
	ann := make(map[string]string, len(ta.RequiredServiceAccountAnnotationKeys)+len(ta.OptionalServiceAccountAnnotationKeys))
	for _, k := range ta.RequiredServiceAccountAnnotationKeys {
		ann[k] = sa.Annotations[k]
	}
	for _, k := range ta.OptionalServiceAccountAnnotationKeys {
		if v, ok := sa.Annotations[k]; ok {
			ann[k] = v
		}
	}
	tok, err := p.identity.Token(ctx, kpod, sa, ta.ServiceAccountTokenAudience)
	if err != nil {
		return saRequest{}, err
	}
	r := saRequest{
		token:       tok,
		annotations: ann,
		account:     &pullcred.ServiceAccount{Namespace: sa.Namespace, Name: sa.Name, UID: string(sa.UID)},
	}
	// The cache key: the account (namespace, name, UID) and the annotations
	// passed; with cacheType Token, the token's hash too.
	parts := []string{sa.Namespace, sa.Name, string(sa.UID), fmt.Sprint(len(ann))}
	keys := make([]string, 0, len(ann))
	for k := range ann {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k, ann[k])
	}
	if ta.CacheType == "Token" {
		parts = append(parts, "token", hashToken(tok))
	}
	r.cacheKey = authcache.FlightKey(parts...)
	return r, nil
}

func hashToken(t string) string {
	sum := sha256.Sum256([]byte(t))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// checkAnswer refuses, as the kubelet does, a credential that is the
// service account token itself unless it is cached per token: cached per
// service account it would outlive the token.
func (p *plugin) checkAnswer(req execRequest, resp *credentialproviderapi.CredentialProviderResponse) error {
	if p.cfg.TokenAttributes == nil || p.cfg.TokenAttributes.CacheType == "Token" || req.ServiceAccountToken == "" {
		return nil
	}
	for _, c := range resp.Auth {
		if c.Password == req.ServiceAccountToken {
			return fmt.Errorf("plugin %s: %w: it returned the service account token as a password, which needs cacheType Token", p.cfg.Name, ErrInvalidResponse)
		}
	}
	return nil
}

// ServiceAccountMayPull reports whether some token provider would run for
// image with the service account sa now: its matchImages match the image
// and sa carries every annotation it requires. A pull recorded for a
// service account may be re-used only while this holds: removing the
// required annotation (the role) is how operators revoke an account's
// access, and a provider no longer configured for the image hands out no
// credential for it. It reads no API and runs no plugin.
func (in *Injector) ServiceAccountMayPull(image string, sa *corev1.ServiceAccount) (bool, string) {
	for _, p := range in.plugins() {
		ta := p.cfg.TokenAttributes
		if ta == nil || !p.matches(image) {
			continue
		}
		if missingAnnotation(ta, sa) == "" {
			return true, "token plugin " + p.cfg.Name + " matches the image and the account carries its required annotations"
		}
	}
	return false, "no token plugin would run for the image with service account " + sa.Namespace + "/" + sa.Name + " now (none matches the image, or a required annotation is gone)"
}

// missingAnnotation returns the first annotation the provider requires
// that sa lacks, "" when it has them all.
func missingAnnotation(ta *TokenAttributes, sa *corev1.ServiceAccount) string {
	for _, k := range ta.RequiredServiceAccountAnnotationKeys {
		if _, ok := sa.Annotations[k]; !ok {
			return k
		}
	}
	return ""
}
