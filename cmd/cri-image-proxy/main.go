// Command cri-image-proxy is a CRI v1 proxy for Kubernetes nodes: the
// kubelet and crictl talk to it as their container runtime, it forwards
// every call to the real runtime (containerd) and intercepts the image path.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cri-image-proxy:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "cri-image-proxy",
		Short: "A CRI image-service proxy for Kubernetes nodes",
		Long: `cri-image-proxy serves CRI v1 on a unix socket in front of the node's container
runtime. The kubelet (--container-runtime-endpoint) and crictl point at it; it
forwards every call to the runtime and intercepts the image path.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCmd(), newVersionCmd())
	return root
}
