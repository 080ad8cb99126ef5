package ensure

import digest "github.com/opencontainers/go-digest"

// RegistryVerification is the registry's own word on the credential a pull went
// with: the image's registry (or a mirror the operator vouched for) named,
// for it, the manifest the runtime holds, served its config, and vouched
// for each of its layers in the repository. Verify returns it to Pull,
// which records with it; explain shows the last ones (its fields by their
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
