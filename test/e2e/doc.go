// Package e2e holds the end-to-end tests: the proxy binary in front of a
// real containerd, with a real password-protected registry, driven by real
// crictl and critest (package test/rig starts them all).
//
// The node tests (TestNode) run the product under real kubelets: their
// scenarios are listed in order in nodeScenarios (node_test.go), each a
// nodeScenario in the file of its theme (node_*_test.go) declaring its
// images and what it needs of the kubelet. registry_requests_test.go
// tells a verification at the registry from a re-use on the node.
//
// The tests need root and the tools of hack/install-deps.sh. Without root
// every test skips and says so; in CI (CI=true) a missing tool is a
// failure, never a skip.
package e2e
