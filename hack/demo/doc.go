// Command demo starts a real containerd, a password-protected registry and
// cri-image-proxy in front of containerd, and shows crictl working through
// the proxy. It is `make demo` (root); with -keep it leaves everything
// running until Ctrl-C so you can try crictl yourself. Everything it starts
// listens on 127.0.0.1 or unix sockets and is stopped at the end.
package main
