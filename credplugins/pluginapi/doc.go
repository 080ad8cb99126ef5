// Package pluginapi is the kubelet's credential provider plugin API
// (KEP-2133) on the wire, for both sides: the proxy encodes requests in a
// provider's apiVersion and decodes responses strictly, refusing any that
// is not a valid CredentialProviderResponse of that version, without ever
// quoting it (it holds credentials); plugins decode requests in any version
// and answer in the request's. One codec, built from the official types and
// conversions of k8s.io/kubelet.
package pluginapi
