// Package authcache caches registry credentials returned by credential
// provider plugins, with the kubelet's semantics (KEP-2133) and what the
// KEP asks beyond them.
//
// Contract:
//
//   - An entry is stored under one of three key types, chosen by the plugin's
//     response: Image (the image repository, e.g. registry.io/team/app),
//     Registry (host[:port], e.g. registry.io) or Global. Get looks them up in
//     that order: image, then registry, then global, as the kubelet does.
//   - A key may carry a second part (the service-account part of KEP-4412);
//     both are length-prefixed, so no two different pairs share a key.
//   - TTL 0 means "do not cache": Put stores nothing. Expired entries are
//     never returned, are dropped on read, and are purged periodically (Run)
//     rather than only on read as in the kubelet.
//   - The cache is bounded: past MaxEntries, expired entries go first, then
//     those expiring soonest.
//   - Do runs one fetch per flight key at a time (singleflight): the caller
//     chooses the key (credplugins: the image, and for a token plugin the
//     token, as the kubelet), so concurrent pulls of one image run one
//     plugin exec per token.
//   - Time comes from an injectable clock. A Cache is safe for concurrent use.
//
// Values are whatever the caller stores; they may be credentials, so the
// cache never logs or exposes them.
package authcache
