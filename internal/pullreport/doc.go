// Package pullreport carries, within one PullImage call, which credential
// an inner interceptor pulled with to the outer ones: credential injection
// reports the plugin credential that succeeded (and the pod's service
// account for a token plugin), and ensure records it instead of the
// request's own. Without With up the chain, Report does nothing.
package pullreport
