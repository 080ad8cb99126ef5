// Command cri-image-proxy is a CRI v1 proxy for Kubernetes nodes: the
// kubelet and crictl talk to it as their container runtime; it forwards
// every call to the real runtime (containerd) and intercepts the image path.
//
//	cri-image-proxy serve [--config FILE] [flags]             the daemon
//	cri-image-proxy config validate|dump [--config FILE] [flags]
//	cri-image-proxy doctor [--config FILE] [flags]           is the kubelet on the proxy?
//	cri-image-proxy plugins validate|test ...
//	cri-image-proxy records list|show|explain|revoke|forget|gc|export
//	cri-image-proxy bake ...
//	cri-image-proxy version
//
// serve exits 0 after SIGTERM or SIGINT once the calls in flight are done
// (or the shutdown timeout passed), and non-zero with a message naming the
// problem when it cannot start: a bad configuration, a socket another
// instance owns. A records database it cannot open is not such a problem:
// it serves, failing closed (see package ensure). Under systemd it says
// READY=1 once its socket accepts calls.
package main
