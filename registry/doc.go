// Package registry asks an image's own registry whether a credential can
// read an image in a repository, content-aware: the registry's word, not
// the runtime's. A pull that succeeded proves nothing when a mirror in
// containerd's hosts.toml (or CRI-O's registries.conf) answered it, or
// when the runtime fetched nothing because the content was already on the
// node.
//
// # The contract
//
// Checker.Check(ctx, Request) resolves Request.Image at the image's
// registry with Request.Credential and returns nil only when:
//
//   - the registry answered the reference for this credential: a GET of
//     the manifest or index, by tag or by digest, whose body matches the
//     digest asked for and the Docker-Content-Digest it named; or, for a
//     tag that resolved to a digest when a previous check GOT its bytes
//     from this endpoint, or a digest whose bytes this endpoint served in
//     this repository before, a HEAD naming that same digest (a GET counts
//     as a pull against Docker Hub's rate limits, a HEAD does not; a tag
//     that moved, or a digest this endpoint and repository never served,
//     is a GET again, so a leaked digest is not enough);
//   - the platform's manifest (picked from an index as containerd picks
//     it) has the config Request.ImageID names, when it names one;
//   - with Request.Blobs, the image's config served by GET, its bytes
//     verified against its digest (a HEAD 200 would let a registry that
//     never held the config name another image already on the node: the
//     runtime fetches nothing it holds), and a HEAD of each other blob the
//     image needs (layers, and any manifest taken from the memory cache)
//     in this repository answered 200, or a redirect to the registry's
//     storage (not followed: a registry redirects only once it found the
//     blob for the credential), all in one round of parallel requests;
//   - with Request.ProveLayers, each layer it names (by diff_id, from the
//     verified config) fetched from this repository for this credential,
//     its bytes the manifest's blob, decompressed to the diff_id, streamed
//     and discarded, bounded by Options.MaxProofBytes,
//     MaxProofUncompressedBytes and ProofTimeout (Result.Proven,
//     Result.ProvenBytes). A runtime shares layers by
//     diff_id without fetching or checking a blob, so for content the node
//     holds from elsewhere only the bytes prove a registry has it.
//
// # Beside the runtime's pull
//
// With Request.Beside (a RuntimePull), the check runs beside the runtime's own pull of the
// image: the registry's word on the reference by HEAD (its
// Docker-Content-Digest; a GET only when a HEAD names none), told to
// RuntimePull.Resolved (an image policy decides on it meanwhile); then, once
// the runtime pulled, its manifest must be the one the registry named (a
// repo digest it recorded for the repository: containerd fetched and
// verified those bytes; else ErrMoved), and the check takes that fetch for
// the manifest's bytes: the config by its bytes (GET), its layers from
// it, and no manifest GET, which Docker Hub counts as a pull, beyond the
// runtime's own. A layer to prove needs its blob: then the manifest is
// fetched. Each question to the registry is bounded by Options.Timeout;
// the wait for the runtime's pull is the caller's. Result.ManifestGets
// counts the manifest GETs a check made.
//
// Otherwise the error matches one of (errors.Is), and is an *Error whose
// Error() is for the operator and whose Reason is short, for the pod:
//
//   - ErrDenied: 401/403 for this credential (or from the token endpoint),
//     the manifest or a blob unknown to this repository (404), or a
//     request the registry refused as such (400, 413, 414, 431: a pull
//     secret too large for its headers is a refusal, not an outage);
//   - ErrForged, a kind of ErrDenied (errors.Is matches both): the
//     config's bytes, or a proven layer's (its blob, or what it
//     decompresses to), are not the content their digest names. The pod
//     reads "the registry's bytes are not the image's config" (or layer);
//     the operator's error names the registry, the repository and both
//     digests, and a warning is logged whoever called;
//   - ErrMoved: the reference resolves to another image than ImageID, or
//     its index has no manifest for the platform;
//   - ErrUnreachable: network, TLS, timeout, 429, 5xx, other statuses, and
//     answers that cannot be used: garbage, over a size bound, or a
//     manifest (or a HEAD's Docker-Content-Digest) that is not the content
//     its digest names. A registry that lies about a manifest's digest is
//     ErrUnreachable: its answer is not a word the check can take, which is
//     not the same as a refusal; both fail closed. A config or a layer is
//     another matter: the registry must serve its bytes to prove it holds
//     them, and other bytes are the proof that it does not (ErrForged).
//
// An error matching none of them is a Request that is not valid (an image
// that does not parse, an ImageID that is no digest). No error, log line
// or metric label ever holds a credential, a token or an Authorization
// header.
//
// # Which endpoint answers
//
// The registry's server as the node's containerd sees it: the hosts.toml
// of Options.HostsDir (containerd's config_path) is read with containerd's
// own code (core/remotes/docker/config.ConfigureHosts), so `server`, `ca`,
// `client`, `skip_verify`, `header`, plain http, localhost and docker.io
// (registry-1.docker.io) behave exactly as they do for the runtime. That
// code lists the `[host."…"]` mirrors first and the server last; a check
// takes the last and never asks a mirror, unless the operator vouched for
// a mirror of that registry (Options.Vouched, Checker.Reload): the check
// then goes there, with the credential, and Result.Vouched says so.
// Requests carry containerd's "ns" query argument where containerd adds
// it, and its Accept header. The HTTP proxy is the process environment's
// (HTTPS_PROXY), as it is containerd's.
//
// On a CRI-O node (Options.RegistriesConf) the registry's server is read
// from the runtime's containers-registries.conf instead, and the *.conf
// drop-ins of the directory beside it named with ".d", as containers/image
// reads them for CRI-O (a drop-in's [[registry]] replaces the one of the
// same prefix; a file containers/image refuses is refused, the error
// naming the file and what is wrong). An image takes the entry of its
// longest matching prefix ("*.example.com": any host under the domain;
// ties go to the first in prefix order, as containers/image has it):
//
//   - a [[registry.mirror]] is never asked, unless vouched;
//   - blocked = true: the check refuses, ErrDenied, "blocked by the
//     node's registries.conf", with no request;
//   - insecure = true: https without verifying the certificate, then
//     plain http, as containers/image tries them;
//   - a location on the registry's host (another namespace) is asked, for
//     the repository it rewrites the image's to;
//   - a location on another host is not the registry's word: CRI-O's
//     containers/image sends a pull's credential only to the host the
//     image names (it drops it for another host, mirror or location), so
//     that host answers the node's own credential, or anyone; the check
//     skips it as a mirror and asks the image's own host, over https,
//     unless the operator vouched for it (then the entry that names the
//     vouched host gives its insecure and its rewrite of the repository);
//   - namespace-proxy adds its "ns" argument; containers/image adds no
//     other, and neither does the check.
//
// TLS files come from containers' certs.d (Options.CertsDir): the first
// root with a <host[:port]> directory; its *.crt are CAs beside the
// system's, each *.cert with its *.key a client certificate. A check reads
// the files again when they changed; files that no longer parse are
// logged once and the ones read before kept, as CRI-O keeps its registries
// when a reload fails; Reload (PrepareReload) refuses them. Describe
// reports what the check reads, for the doctor.
//
// # Authentication
//
// The token flow is containerd's (core/remotes/docker's authorizer:
// basic, bearer with the OAuth POST and the GET fallback, identity tokens
// as refresh tokens), chosen over go-containerregistry's transport because
// it is the runtime's own code on the same hosts configuration, and its
// authorizer can be seeded with a known challenge where ggcr's transport
// pings the registry first. A registry token (which containerd ignores) is
// sent as a bearer token as is. Each check has its own authorizer, so a
// token fetched with one credential never serves another credential's
// check. Each endpoint's challenge (scheme, realm, service; never a scope)
// is remembered, and a new check's authorizer is seeded with it: no 401
// round before the credential is sent. A 401 with another challenge (a
// stale one) is learnt and the request sent once more. A 401 from a
// redirect's target (the registry's storage) is that host's: it is never
// learnt for the endpoint, and no credential goes to its realm.
//
// So with a remembered challenge a check of a single-manifest image is one
// request for the manifest (GET, or HEAD for a remembered tag), then one
// round of parallel HEADs (plus the token request on a token registry):
// the rounds of the runtime's own re-check pull (HEAD 401, HEAD; HEAD 401,
// token, HEAD). Result.Requests counts every HTTP request.
//
// # Bounds
//
// Every check is bounded by Options.Timeout (its layer proofs by
// Options.ProofTimeout); every answer's body by 4 MiB (a proven layer's by
// Options.MaxProofBytes, and what it decompresses to by
// Options.MaxProofUncompressedBytes, so that a decompression bomb stops
// there and not at the timeout; a zstd frame's window, which the decoder
// allocates whole, by 128 MiB, the zstd command's own limit); an image by
// 1024 blobs; HEADs in flight by Options.MaxParallel. A proof past a bound
// fails closed as ErrUnreachable ("a layer is over the proof bound"), not
// as a forgery: nothing says the bytes are not the content. Manifest
// bodies verified by digest are kept in memory, parsed, up to
// Options.ManifestCacheBytes, with the endpoints and repositories that
// served them: they save fetching an index's platform manifest (or a
// digest reference) again there, never the registry's word on this
// repository and credential, which a HEAD then gives.
//
// # What it does not prove
//
// A HEAD answered 200 is the registry's word, taken for the registry's own
// repositories. A registry run by the party asking can answer 200 for
// blobs it does not hold; the check then proves that it served the
// manifest and the config (which knowing their digests does not give),
// and, for the layers ProveLayers names, their bytes. Which layers need
// their bytes is the caller's decision (the node's content, which this
// package does not know).
//
// Metrics (Options.Registerer), labelled by registry host and the
// endpoint asked (scheme and host: the server, or a vouched mirror),
// bounded: a host earns its own label when it answered a reference as a
// registry (or the operator vouched a mirror for it), up to 64; others
// are "other":
// cri_image_proxy_registry_checks_total{registry,endpoint,result}
// (verified, denied, forged, moved, unreachable, invalid),
// cri_image_proxy_registry_blob_checks_total{registry,endpoint,result}
// (present, missing, refused, forged, error),
// cri_image_proxy_registry_layer_proofs_total{registry,endpoint,result}
// (proven layers; forged, over_bound, failed proofs),
// cri_image_proxy_registry_request_duration_seconds{registry,endpoint}.
//
// The files by role: checker.go the Checker and Check; request.go a
// check's Request, Credential and Result; check.go one check's state and
// its steps (run); resolve.go and manifest.go what a reference names;
// blobs.go the round of blob requests (a HEAD of each layer, the config's
// GET among them); config.go the config proven by its bytes and a forged
// config refused (its GET, its digest, its refusal, and the config asked
// early beside the runtime's pull); layers.go layer proofs by their
// bytes; beside.go a check beside the runtime's pull; auth.go and
// challenge.go authentication; transport.go the requests themselves;
// endpoints.go, crio.go and registriesconf.go where a registry is
// reached; errors.go the failures and the refusal a pod reads; metrics.go
// and labels.go the metrics and their bounded labels; describe.go what
// the check reads, for the doctor.
package registry
