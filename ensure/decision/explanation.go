package decision

import (
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
)

// What a decision is explained by, to the records commands and the admin
// API: ensure fills these in (its Explain and ExplainPolicy, its pulls'
// verifications); here they are the vocabulary the commands and the API
// share without importing ensure.

// Explanation says what the guard decides for an image and a pod, and why.
type Explanation struct {
	Image      string          `json:"image"`
	ImageRef   string          `json:"imageRef,omitempty"`
	Repository string          `json:"repository,omitempty"`
	Present    bool            `json:"present"`
	Policy     string          `json:"policy"`
	Record     *records.Record `json:"record,omitempty"`
	// Preloaded are the names the image was listed under before its first
	// recorded pull: free to every pod under NeverVerifyPreloadedImages.
	Preloaded []string `json:"preloaded,omitempty"`

	NeedsVerification bool   `json:"needsVerification"`
	Result            string `json:"result"` // the kubelet's result name
	Rule              string `json:"rule"`

	PodUID      string `json:"podUID,omitempty"`
	GrantsKnown bool   `json:"grantsKnown"` // false when the daemon does not run
	PodGranted  bool   `json:"podGranted"`

	Verdict string `json:"verdict"`

	// Layers are the image's layers (diff_ids) as the proxy knows them,
	// and when it first knew them (its pull, or its first sighting on
	// the node); nil when it does not.
	Layers     []string   `json:"layers,omitempty"`
	LayersSeen *time.Time `json:"layersSeen,omitempty"`
	Vouched    []string   `json:"vouchedBy,omitempty"` // repositories of the record that vouched for every layer

	// Verifications are the registry's last word on the credentials the
	// daemon recorded for the image, by repository: which endpoint
	// answered (the registry, or a vouched-for mirror), with which kind of
	// credential, and how many blobs it checked. Known to the daemon only,
	// in memory, since its start.
	Verifications []Verification `json:"verifications,omitempty"`
}

// Verification is the registry's word on one recorded credential.
type Verification struct {
	Repository string `json:"repository"`
	RegistryVerification
	At time.Time `json:"at"`
}

// RegistryVerification is the registry's own word on the credential a pull went
// with: the image's registry (or a mirror the operator vouched for) named,
// for it, the manifest the runtime holds, served its config, and vouched
// for each of its layers in the repository. ensure's Verify returns it to
// its Pull, which records with it; explain shows the last ones (its fields by their
// Go names on the admin API).
type RegistryVerification struct {
	ImageID        string // the image the registry's answer is (its config digest)
	Registry       string // the registry the name names
	Endpoint       string // who answered: the registry, or a vouched-for mirror
	Vouched        bool   // the endpoint is a vouched-for mirror
	CredentialKind string // anonymous, basic, identity token, registry token
	ManifestDigest string
	Blobs          int // blobs checked in the repository
	// CheckedBlobs names the blobs found present (the config, then the
	// layers), at most MaxListedBlobs of them: what explain shows.
	CheckedBlobs []string
	Requests     int // requests the check made
	// FromNode: the image was already on the node; the registry's answer
	// stood for the pull, and the runtime was not asked to pull.
	FromNode bool
	// Layers are the image's layers (diff_ids, from its config the check
	// fetched), each vouched for by the repository (LayersKnown: the check
	// read them); ProvenLayers those it proved by their bytes, at the cost
	// of ProvenBytes.
	Layers       []digest.Digest
	LayersKnown  bool
	ProvenLayers []digest.Digest
	ProvenBytes  int64
}

// MaxListedBlobs bounds CheckedBlobs: the daemon keeps thousands of
// verifications in memory for explain.
const MaxListedBlobs = 16

// PolicyExplanation is what the image policy would decide for an image
// used by a container of a namespace, for each repository it is decided
// as (records explain --namespace).
type PolicyExplanation struct {
	Image    string            `json:"image"`
	ImageRef string            `json:"imageRef,omitempty"`
	Present  bool              `json:"present"`
	As       []PolicyDecidedAs `json:"as"`
}

// PolicyDecidedAs is the image decided as one repository.
type PolicyDecidedAs struct {
	Repository  string                  `json:"repository,omitempty"`
	Digest      string                  `json:"digest,omitempty"`
	Explanation imagepolicy.Explanation `json:"explanation"`
}
