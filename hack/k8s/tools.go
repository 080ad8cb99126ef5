//go:build tools

// Package tools pins the Kubernetes components the e2e tests build from
// the Go module proxy: kube-apiserver and etcd (and, for the node tests,
// the kubelet). It is a module of its own so that k8s.io/kubernetes never
// enters the project's go.mod.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
