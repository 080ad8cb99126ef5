// Package daemon assembles and runs cri-image-proxy serve.
package daemon
