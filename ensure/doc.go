// Package ensure enforces "ensure secret-pulled images" (KEP-2535) at the
// CRI layer: an image pulled with credentials is handed only to pods whose
// credential, or service account, was verified for that image; any other
// pod must pull (and so authenticate at the registry) or is refused.
//
// # What it decides, and where
//
// The CRI carries a pod's identity only on PullImage (sandbox_config) and
// CreateContainer; ImageStatus carries none. So:
//
//   - ImageStatus by name: when the image is present but its repository
//     needs verification for this node (decision.Policy.VerificationRequired), the answer is
//     "not present": the kubelet then pulls (IfNotPresent) or refuses
//     (Never) with the message it uses for a missing image. Lookups by image
//     ID are answered as the runtime answers them.
//   - PullImage: right after such a hide, a request whose credential (salted
//     hash of its auth, or service account) is already verified for the image
//     and repository gets the image's ID at once, with no registry traffic.
//     Anything else goes on under a durable intent to the registry check
//     (Verify, the innermost hook, after credential injection): the image's
//     own registry, never a mirror unless vouched for, must resolve the name
//     for the credential the try goes with to the image, each blob readable
//     in the repository. An image already on the node is then answered from
//     the node; otherwise the runtime pulls and must get that image. Only
//     then is the credential added to the record, committed before the
//     answer. Whatever way a pull ends, an image the runtime holds afterwards
//     is recorded or tracked as pulled with no verified credential. Every
//     allowed pull grants the pod (sandbox UID) the image.
//   - CreateContainer: refused with PermissionDenied when any image the
//     container would see (its image, and the image of every image volume
//     mount, config.mounts[].image; by name, ID or ID prefix) needs
//     verification and the pod has no grant. When the runtime cannot answer
//     which image a name stands for, an image that may need verification is
//     refused with Unavailable.
//   - RemovePodSandbox drops the pod's grants; RemoveImage drops the record.
//
// On any doubt (a store error, an unknown repository, an undecodable
// record) the answer is "must verify": an unreadable record is decided as
// if the image had been pulled with credentials. A database that cannot
// be opened at all is replaced by UnavailableStore, on which the same
// rules refuse every image a policy would ever verify, and every pull.
// Secrets are never stored: only salted SHA-256 hashes, with a random salt
// per database.
//
// # Image policy
//
// With an ImagePolicy (package imagepolicy/cri), the Guard also decides, after
// ensure's own decision: each try of a pull on the manifest digest the
// image's registry resolved for it, before the runtime pulls (Verify; the
// runtime's image must then be the one the registry answered, so the pull
// is pinned to that digest, and the verdict is bound to its image ID); and
// each image a container would see, for the pod's namespace, by the
// repository it is named or listed under and the repo digest the runtime
// recorded (Admit). A refusal is PermissionDenied with the policy's short
// reason; a runtime that cannot answer is Unavailable where a provider
// applies. With ensure off, image policy's own hooks (package
// imagepolicy/cri) make the same decisions with a registry check and
// runtime questions of their own.
//
// # Shape
//
// The core speaks plain Go: the Decider (decider.go) decides what the
// records, the policy, the runtime and the pulls in flight say of an image.
// The Guard is three parts over it, each owning its state: the Guard
// itself holds the CRI path's state and its calls Hide (hide.go), Admit
// (admit.go) and Remove (lifecycle.go); the puller (pull.go, verify.go)
// is the pull path, owning the registry check, credential injection and
// the runtime's store; the ledger (settle.go, intents.go, layers.go) keeps
// the facts every end leaves: a pull's, an intent kept or left by a crash,
// an image that arrived around the proxy. Each intercepted CRI method has one
// file (image_status.go, image_pull.go, container_create.go,
// image_remove.go, sandbox_remove.go, runtime_status.go) that only
// translates the CRI request to a core call and its answer back;
// interceptors.go lists them, in order. A pull is one loop over its tries
// (puller.Pull, pull.go), each checked at the registry beside the
// runtime's pull (Verify, verify.go), every end settled in one place
// (ledger.settle, settle.go). The rules decisions apply are package
// decision (the kubelet's policies, the records' expiry); which layers are
// private is package layerprivacy; the database is met as a RecordReader
// and a RecordWriter (store.go).
//
// # Records
//
// A record (kubelet.config.k8s.io/v1beta1 ImagePulledRecord, as the kubelet
// writes them) is keyed by the runtime's image ID and maps each normalized
// repository to the credentials verified for it. An intent
// (ImagePullIntent) is written before a pull is forwarded and removed with
// the record's update in the same transaction; an intent left by a crash
// becomes, at start, a record with no credential (every pod must verify).
// The first record of an image that was on the node keeps the names the
// runtime listed it under before that pull (its preloaded names, the
// kubelet's ImagePreloadedRecord by full name): by them, and by its ID,
// the image stays free to every pod as it was, while the name pulled with
// credentials is its puller's (Decider.decide, ledger.namesBeforePull).
//
// The records database is package records (ensure/records): its layout,
// migrations and durability are documented there. A write that fails (a
// full or read-only filesystem) makes the guard not Ready and its records
// condition false until a write succeeds; meanwhile MendWrites probes the
// database with a write that changes no record (records.Store.ProbeWrite),
// backing off to one every 5 s, so that the guard is Ready again within
// seconds of the fix, with no pull. While writes succeed nothing probes.
package ensure
