// Package e2e holds the end-to-end tests: the proxy binary in front of a
// real containerd, with a real password-protected registry, driven by real
// crictl and critest (package internal/rig starts them all).
//
// The tests need root and the tools of hack/install-deps.sh. Without root
// every test skips and says so; in CI (CI=true) a missing tool is a
// failure, never a skip.
package e2e
