// Package podtoken answers, for a pod of this node, what a KEP-4412
// credential provider needs: the pod (from a node-scoped informer, a GET
// when the informer does not have it), its ServiceAccount (a live GET, as
// the kubelet does: a re-created account has a new UID), and a token bound
// to the pod for an audience (TokenRequest, cached until 80% of its life).
// It also reads the pull secrets of pods (reused for 30 s), and, for the
// pod-aware ImageStatus's prediction only, service accounts as a read of
// the last 5 s found them (RecentServiceAccount).
//
// Contract:
//   - A pod is identified by namespace, name and UID, as the CRI's sandbox
//     metadata gives them; a pod whose UID differs is another pod
//     (ErrPodMismatch), never used.
//   - Tokens never leave this package except to the caller, and are never
//     logged.
//   - Every API error is returned wrapped, naming the object.
//
// Registering client-go's metrics (RegisterClientMetrics) puts its
// KEP-541 exec-plugin metrics and request counts on a Prometheus registry.
package podtoken
