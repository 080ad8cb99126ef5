package records

import (
	"slices"

	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// Record is what the proxy knows of one pulled image: the kubelet's own
// record type.
type Record = kubeletconfigv1beta1.ImagePulledRecord

// Intent is a pull in flight, by its ID.
type Intent struct {
	ID    string
	Image string
}

// ServiceAccount is a service account's coordinates (KEP-4412).
type ServiceAccount = kubeletconfigv1beta1.ImagePullServiceAccount

// Credential is who pulled an image: the salted hash of the request's
// auth, a service account, or the node itself (an anonymous pull, or
// node-wide plugin credentials), which makes the repository of the image
// accessible to every pod on the node.
type Credential struct {
	Hash string
	// Secret names the pull secret the credential came from, when it is
	// known (with the Kubernetes API): a rotated secret (same coordinates,
	// new content) keeps its pods' re-use, as in the kubelet.
	Secret         *SecretRef
	ServiceAccount *ServiceAccount
	Node           bool
}

// SecretRef is a pull secret's coordinates.
type SecretRef struct {
	Namespace, Name, UID string
}

// Limits of a record, as the kubelet's writeRecordWhileMatchingLimit: a
// record does not grow without bound. Past the limit a new credential is
// still allowed its pull, it is just not remembered (it verifies again).
const maxCredentialsPerRepository = 100

// NodeKey is the node's own credential key (an anonymous or node-wide
// pull), and HashKey a credential's by its salted hash: the keys the
// decisions look verification times up by (CredentialKeys makes them all).
const NodeKey = "node"

// HashKey is the key of the credential whose salted hash is hash.
func HashKey(hash string) string { return "h:" + hash }

// CredentialKeys name a credential in the verification times (VerifiedAt):
// "node" for the node itself, "sa:UID/NAMESPACE/NAME" for a service
// account, "h:HASH" for a credential's salted hash and, when its secret is
// known, "s:UID" for the secret (a rotated secret is matched by it).
func CredentialKeys(cred Credential) []string {
	switch {
	case cred.Node:
		return []string{NodeKey}
	case cred.ServiceAccount != nil:
		sa := cred.ServiceAccount
		return []string{"sa:" + sa.UID + "/" + sa.Namespace + "/" + sa.Name}
	}
	var keys []string
	if cred.Hash != "" {
		keys = append(keys, HashKey(cred.Hash))
	}
	if cred.Secret != nil && cred.Secret.UID != "" {
		keys = append(keys, "s:"+cred.Secret.UID)
	}
	return keys
}

// SecretKeys are the keys of a record's secret entry: its salted hash's,
// and its secret's when the record knows the secret.
func SecretKeys(s kubeletconfigv1beta1.ImagePullSecret) []string {
	return CredentialKeys(Credential{Hash: s.CredentialHash, Secret: &SecretRef{UID: s.UID, Namespace: s.Namespace, Name: s.Name}})
}

// AccountKey is a service account's key.
func AccountKey(sa ServiceAccount) string {
	return CredentialKeys(Credential{ServiceAccount: &sa})[0]
}

// MergeCredential merges cred into r's mapping for repo, as the kubelet
// does (writeRecordWhileMatchingLimit): a zero Credential still creates the
// mapping (the image was pulled for repo, by someone unknown, and every pod
// must verify); a secret already listed under its coordinates with another
// hash is a rotated secret, whose entry takes the new hash; nothing is
// added past maxCredentialsPerRepository. Stores call it; it is exported
// for other implementations of RecordStore.
func MergeCredential(r *Record, repo string, cred Credential) {
	if r.CredentialMapping == nil {
		r.CredentialMapping = map[string]kubeletconfigv1beta1.ImagePullCredentials{}
	}
	c := r.CredentialMapping[repo]
	switch {
	case cred.Node:
		c.NodePodsAccessible = true
	case cred.Hash != "":
		c.KubernetesSecrets = mergeSecret(c.KubernetesSecrets, cred)
	case cred.ServiceAccount != nil:
		if !slices.Contains(c.KubernetesServiceAccounts, *cred.ServiceAccount) &&
			len(c.KubernetesServiceAccounts) < maxCredentialsPerRepository {
			c.KubernetesServiceAccounts = append(c.KubernetesServiceAccounts, *cred.ServiceAccount)
		}
	}
	r.CredentialMapping[repo] = c
}

func mergeSecret(secrets []kubeletconfigv1beta1.ImagePullSecret, cred Credential) []kubeletconfigv1beta1.ImagePullSecret {
	entry := kubeletconfigv1beta1.ImagePullSecret{CredentialHash: cred.Hash}
	if s := cred.Secret; s != nil {
		entry.Namespace, entry.Name, entry.UID = s.Namespace, s.Name, s.UID
	}
	for i, s := range secrets {
		switch {
		case s.CredentialHash == cred.Hash && (s.UID != "" || cred.Secret == nil):
			return secrets // known
		case s.CredentialHash == cred.Hash, cred.Secret != nil && SameSecret(s, entry):
			// Known by hash, now with its coordinates; or the same secret
			// with new content (rotated): the entry takes the new hash.
			secrets[i] = entry
			return secrets
		}
	}
	if len(secrets) >= maxCredentialsPerRepository {
		return secrets
	}
	return append(secrets, entry)
}

// SameSecret reports whether two secret entries name the same secret:
// namespace, name and a known UID (a deleted and re-created secret has a
// new UID).
func SameSecret(a, b kubeletconfigv1beta1.ImagePullSecret) bool {
	return a.UID != "" && a.UID == b.UID && a.Namespace == b.Namespace && a.Name == b.Name
}

// MarkPulled gives r an empty mapping for each of repos it has none for,
// and returns how many it added: the image was pulled as that repository
// with no credential known, so every pod must verify (as MergeCredential
// with the zero Credential). A mapping r has is left as it is.
func MarkPulled(r *Record, repos []string) int {
	n := 0
	for _, repo := range repos {
		if _, ok := r.CredentialMapping[repo]; !ok {
			MergeCredential(r, repo, Credential{})
			n++
		}
	}
	return n
}
