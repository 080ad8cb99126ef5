package ensure

import (
	"context"
	"iter"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// NodePods is what the guard reads of the Kubernetes API, when it has one:
// the node's pods, their pull secrets and service accounts.
// podtoken.Source is the real one.
type NodePods interface {
	// PodsOnNode lists the node's pods (an informer's cache); nil when it
	// has not synced.
	PodsOnNode() []*corev1.Pod
	// Pod returns the pod namespace/name with UID uid.
	Pod(ctx context.Context, namespace, name, uid string) (*corev1.Pod, error)
	// Secret reads a secret.
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// ServiceAccount reads a service account, live.
	ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)
	// RecentServiceAccount reads a service account, or returns a read of
	// the last few seconds: for ImageStatus's prediction only.
	RecentServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)
}

// accountRead reads a service account: NodePods' ServiceAccount (live)
// or RecentServiceAccount.
type accountRead func(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)

// AccountCheck says whether a pull recorded for a service account may be
// re-used now; *credplugins.Injector is the real one.
type AccountCheck interface {
	// ServiceAccountMayPull reports whether some token plugin would run for
	// image with sa now: it matches the image and sa carries every
	// annotation it requires.
	ServiceAccountMayPull(image string, sa *corev1.ServiceAccount) (bool, string)
}

// entitlements decide whether a pod is entitled to an image by what it
// would pull with (its pull secrets, its service account), read from the
// Kubernetes API, against the records: the kubelet's MustAttemptImagePull
// with the pod's credentials, for the CRI path (pulls answered from the
// node, creates, ImageStatus for the pods waiting). Without the API
// (pods nil), no pod is entitled.
type entitlements struct {
	pods     NodePods
	accounts AccountCheck
	// d reads the records, their freshness and names, and logs decisions.
	d *Decider
}

// podEntitled is the one entitlement check of the CRI path: whether pod
// may use imageRef as repo by what it would pull with (its pull secrets,
// its service account), read from the API. The kubelet decides so
// (MustAttemptImagePull) before it asks the runtime; the proxy sees only
// the CRI pod, so it reads the pod. No API, no pod UID, an unknown
// repository or any read error: not entitled.
func (e *entitlements) podEntitled(ctx context.Context, pod crireq.Pod, imageRef, repo string) (bool, string) {
	if e.pods == nil || pod.UID == "" || repo == "" {
		return false, ""
	}
	kpod, err := e.pods.Pod(ctx, pod.Namespace, pod.Name, pod.UID)
	if err != nil {
		return false, ""
	}
	return e.entitled(ctx, kpod, imageRef, repo, e.pods.ServiceAccount)
}

// podAccount returns the pod's service account coordinates when a pull
// recorded for that account may be re-used for image now: the pod has
// one, read can read it, and a token plugin would still run for it (see
// AccountCheck). nil otherwise: re-use by account is then not possible.
func (e *entitlements) podAccount(ctx context.Context, pod *corev1.Pod, image string, read accountRead) *ServiceAccount {
	if pod.Spec.ServiceAccountName == "" {
		return nil
	}
	sa, err := read(ctx, pod.Namespace, pod.Spec.ServiceAccountName)
	if err != nil {
		return nil
	}
	if e.accounts == nil {
		return nil
	}
	if ok, why := e.accounts.ServiceAccountMayPull(image, sa); !ok {
		e.d.logDecision(ctx, "service account re-use not possible", image, "", pod.Namespace+"/"+pod.Name, why)
		return nil
	}
	return &ServiceAccount{Namespace: sa.Namespace, Name: sa.Name, UID: string(sa.UID)}
}

// entitled reports whether pod may use imageRef as repo with what it would
// pull with: one of its pull secrets whose credential for repo has its
// salted hash in the record, or its service account (as account reads it)
// in the record. Any read error means "not entitled".
func (e *entitlements) entitled(ctx context.Context, pod *corev1.Pod, imageRef, repo string, account accountRead) (bool, string) {
	rec, err := e.d.store.Get(imageRef)
	if err != nil {
		return false, ""
	}
	c, ok := rec.CredentialMapping[repo]
	if !ok {
		return false, ""
	}
	// A match whose verification is older than the maximum record age
	// (when one is set) entitles no more: the pod verifies again.
	var expired string
	if c.NodePodsAccessible {
		ok, why := e.d.fresh(imageRef, repo, records.NodeKey)
		if ok {
			return true, "accessible to all pods of the node"
		}
		expired = "the node's pull was " + why
	}
	if len(c.KubernetesServiceAccounts) > 0 {
		if sa := e.podAccount(ctx, pod, repo, account); sa != nil && slices.Contains(c.KubernetesServiceAccounts, *sa) {
			ok, why := e.d.fresh(imageRef, repo, records.AccountKey(*sa))
			if ok {
				return true, "its service account " + sa.Namespace + "/" + sa.Name + " was verified for " + repo
			}
			expired = "its service account " + sa.Namespace + "/" + sa.Name + " was " + why
		}
	}
	if len(c.KubernetesSecrets) == 0 {
		return false, expired
	}
	for sec := range e.pullSecrets(ctx, pod) {
		hashes := e.secretHashes(sec, repo)
		if len(hashes) == 0 {
			// As the kubelet's keyring, which looks the secret's credentials
			// up for the image's registry before it matches coordinates: a
			// secret that no longer holds one entitles nobody, whatever its
			// coordinates.
			continue
		}
		coords := kubeletSecret{Namespace: sec.Namespace, Name: sec.Name, UID: string(sec.UID)}
		if i := slices.IndexFunc(c.KubernetesSecrets, func(s kubeletSecret) bool { return records.SameSecret(s, coords) }); i >= 0 {
			// The kubelet's deliberate choice for rotated secrets: the same
			// secret (namespace, name and UID) with new content still
			// entitles its pods.
			ok, why := e.d.fresh(imageRef, repo, records.SecretKeys(c.KubernetesSecrets[i])...)
			if ok {
				return true, "its pull secret " + sec.Namespace + "/" + sec.Name + " was verified for " + repo + " (by its coordinates; its content may have been rotated since)"
			}
			expired = "its pull secret " + sec.Namespace + "/" + sec.Name + " was " + why
		}
		for _, h := range hashes {
			if slices.ContainsFunc(c.KubernetesSecrets, func(s kubeletSecret) bool { return s.CredentialHash == h }) {
				ok, why := e.d.fresh(imageRef, repo, records.HashKey(h))
				if ok {
					return true, "its pull secret " + sec.Namespace + "/" + sec.Name + " was verified for " + repo
				}
				expired = "its pull secret " + sec.Namespace + "/" + sec.Name + " was " + why
			}
		}
	}
	return false, expired
}

// pullSecrets yields the pod's pull secrets that can be read; a deleted
// one entitles nobody and is skipped.
func (e *entitlements) pullSecrets(ctx context.Context, pod *corev1.Pod) iter.Seq[*corev1.Secret] {
	return func(yield func(*corev1.Secret) bool) {
		for _, ref := range pod.Spec.ImagePullSecrets {
			if sec, err := e.pods.Secret(ctx, pod.Namespace, ref.Name); err == nil && !yield(sec) {
				return
			}
		}
	}
}

// secretHashes returns the salted hashes of sec's credentials for repo.
func (e *entitlements) secretHashes(sec *corev1.Secret, repo string) []string {
	var out []string
	for _, a := range secretCredentials(sec, repo) {
		out = append(out, e.d.store.HashAuth(a))
	}
	return out
}

// secretOf returns the coordinates of the pod's pull secret whose
// credential for repo hashes to hash, nil when there is no API, no pod or
// no such secret (the record then holds the hash alone).
func (e *entitlements) secretOf(ctx context.Context, p crireq.Pod, repo, hash string) *SecretRef {
	if e.pods == nil || p.UID == "" {
		return nil
	}
	pod, err := e.pods.Pod(ctx, p.Namespace, p.Name, p.UID)
	if err != nil {
		return nil
	}
	for sec := range e.pullSecrets(ctx, pod) {
		if slices.Contains(e.secretHashes(sec, repo), hash) {
			return &SecretRef{Namespace: sec.Namespace, Name: sec.Name, UID: string(sec.UID)}
		}
	}
	return nil
}

// secretCredentials returns the credentials of a docker config secret
// that match repo, as the kubelet's keyring would send them to the
// runtime: username and password only. A secret that does not parse gives
// none (its pod is then not entitled by it).
func secretCredentials(sec *corev1.Secret, repo string) []Auth {
	var cfg *keyring.DockerConfig
	var err error
	switch sec.Type {
	case corev1.SecretTypeDockerConfigJson:
		cfg, err = keyring.ParseDockerConfig(sec.Data[corev1.DockerConfigJsonKey])
	case corev1.SecretTypeDockercfg:
		cfg, err = keyring.ParseDockercfg(sec.Data[corev1.DockerConfigKey])
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	var out []Auth
	for _, c := range cfg.Credentials(repo) {
		out = append(out, Auth{Username: c.Username, Password: c.Password})
	}
	return out
}

// waitingUses returns, per pod of the node, the pull policies of its
// uses of image (as the kubelet names it) that have not started yet: the
// containers (init, regular, ephemeral) of that image not running, and the
// image volumes (KEP-4639, spec.volumes[].image, with their own pull
// policy) of a pod with a container not started. These are what an
// ImageStatus for image can be for.
func (e *entitlements) waitingUses(image string) map[*corev1.Pod][]corev1.PullPolicy {
	want := e.d.parse(image)
	if !want.OK {
		return nil
	}
	same := func(name string) bool { n := e.d.parse(name); return n.OK && n.Ref == want.Ref }
	out := map[*corev1.Pod][]corev1.PullPolicy{}
	for _, p := range e.pods.PodsOnNode() {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		started := map[string]bool{}
		for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
			for _, st := range list {
				started[st.Name] = st.State.Running != nil || st.State.Terminated != nil
			}
		}
		var cs []corev1.Container
		cs = append(cs, p.Spec.InitContainers...)
		cs = append(cs, p.Spec.Containers...)
		for _, e := range p.Spec.EphemeralContainers {
			cs = append(cs, corev1.Container(e.EphemeralContainerCommon))
		}
		allStarted := true
		for _, c := range cs {
			if started[c.Name] {
				continue
			}
			allStarted = false
			if same(c.Image) {
				out[p] = append(out[p], c.ImagePullPolicy)
			}
		}
		if allStarted {
			continue // its image volumes are mounted already
		}
		for _, v := range p.Spec.Volumes {
			if v.Image != nil && same(v.Image.Reference) {
				out[p] = append(out[p], v.Image.PullPolicy)
			}
		}
	}
	return out
}

// entitlementKey is what entitled reads of a pod: pods with the same are
// entitled alike.
type entitlementKey struct {
	namespace, account, secrets string
}

func entitlementKeyOf(pod *corev1.Pod) entitlementKey {
	// Each name is prefixed with its length: the API validates the
	// namespace and the account's name, not the names of
	// spec.imagePullSecrets, which may hold any byte (a separator too).
	var secrets strings.Builder
	for _, ref := range pod.Spec.ImagePullSecrets {
		secrets.WriteString(strconv.Itoa(len(ref.Name)))
		secrets.WriteByte(':')
		secrets.WriteString(ref.Name)
	}
	return entitlementKey{namespace: pod.Namespace, account: pod.Spec.ServiceAccountName, secrets: secrets.String()}
}

// showToWaiters reports whether ImageStatus may show the image although it
// needs verification, because of the pods waiting for it. ImageStatus
// carries no pod, so one answer serves them all:
//   - an entitled pod with pull policy Never can only start if it is shown
//     (hidden, it ends in ErrImageNeverPull): it is shown, whoever else
//     waits. A pod that is not entitled cannot keep another tenant's
//     entitled pods from their image (one tenant cannot block another); it
//     is refused at CreateContainer and verifies by pulling once no entitled
//     Never pod waits;
//   - otherwise it is shown when some waiting pod is entitled and none of
//     the others could verify by pulling (they are Never: refused at
//     CreateContainer instead of ErrImageNeverPull); an entitled pod that
//     can pull re-uses the image through PullImage anyway.
//
// In doubt (no API, no pod), hidden.
func (e *entitlements) showToWaiters(ctx context.Context, image, imageRef, repo string) (bool, string) {
	if e.pods == nil {
		return false, ""
	}
	var entitled []string
	entitledNever, otherCouldPull := false, false
	// A pod is entitled by its namespace, service account and pull secrets
	// alone: a storm's pods share a few such sets, and each set is decided
	// once per answer. Its account is a read of the last few seconds
	// (RecentServiceAccount), shared by the answers of a storm, which would
	// otherwise each wait for a live GET from a busy API server: showing
	// is a prediction, and the CreateContainer that follows decides with a
	// live read (Admit), so a re-created account's pod shown the image by
	// its old UID is refused there, and verifies by pulling on its retry.
	decided := map[entitlementKey]bool{}
	for pod, policies := range e.waitingUses(image) {
		key := entitlementKeyOf(pod)
		ok, seen := decided[key]
		if !seen {
			ok, _ = e.entitled(ctx, pod, imageRef, repo, e.pods.RecentServiceAccount)
			decided[key] = ok
		}
		if ok {
			entitled = append(entitled, pod.Namespace+"/"+pod.Name)
			entitledNever = entitledNever || slices.Contains(policies, corev1.PullNever)
			continue
		}
		otherCouldPull = otherCouldPull || slices.ContainsFunc(policies, func(p corev1.PullPolicy) bool { return p != corev1.PullNever })
	}
	switch {
	case len(entitled) == 0:
		return false, ""
	case entitledNever:
		slices.Sort(entitled)
		return true, "entitled pods with pull policy Never wait for it (" + strings.Join(entitled, ", ") + "); any other is refused at CreateContainer"
	case otherCouldPull:
		return false, ""
	}
	slices.Sort(entitled)
	return true, "pods waiting for it are entitled (" + strings.Join(entitled, ", ") + "); the others would be refused at CreateContainer"
}
