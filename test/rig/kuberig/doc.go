// Package kuberig adds a real Kubernetes control plane and real kubelets to
// a rig: etcd and kube-apiserver (Node, RBAC and NodeRestriction, static
// tokens, an optional audit log) and kubelets of the current and the old
// version whose CRI endpoint is whatever the test names, all on 127.0.0.1
// and in the rig's directory.
//
// It is apart from package rig so that what needs only containerd and a
// registry (the demo, most e2e tests) does not compile client-go's typed
// clients: that halves the demo's cold build.
package kuberig
