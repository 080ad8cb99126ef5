// Package pullreport carries what the hooks of one PullImage tell each
// other. Outwards: credential injection reports the plugin credential that
// succeeded (and the pod's service account for a token plugin), and the
// registry check reports the registry's verification of the credential the
// pull went with; ensure records what they report instead of the
// request's own credential. Inwards: ensure tells the registry check which
// image the name stood for on the node, so that a check that finds the
// same image answers from the node. Without Start up the chain, reports
// do nothing.
package pullreport
