//go:build tools

// Package tools pins the old kubelet the node e2e tests also run: one from
// before KEP-2535 and KEP-4412 (1.33), the proxy's main customer. It is a
// module of its own, like ../k8s, so that its Kubernetes version never
// meets the project's or the current components'.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
