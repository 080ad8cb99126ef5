package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// Runtime defaults, used unless GOGC or GOMAXPROCS is set in the
// environment. Both come from `make bench` on a 2-core node (see
// docs/benchmarks.md, "The runtime defaults").
const (
	// The proxy keeps a small heap and allocates per call, so the default
	// target (100) collects very often; 300 cut its CPU per pass-through
	// call by about a fifth, for some 10-20 MiB more heap.
	defaultGCPercent = 300
	// A pass-through call costs the proxy 15-20 µs of CPU: one core serves
	// tens of thousands a second, far more than a kubelet asks. With more
	// Ps the scheduler spins between calls: GOMAXPROCS=2 cost 35% more CPU
	// and 40% more latency per call at the kubelet's call rate (c=1), and
	// gave no more throughput at c=64. Under 64 concurrent checked pulls
	// one P keeps the kubelet's ImageStatus and CreateContainer p99 within
	// 0.7-1.05x of Go's own settings, for 15% less CPU than two (since a
	// re-check writes no record; docs/benchmarks.md).
	defaultMaxProcs = 1
)

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(defaultMaxProcs)
	}
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
	root.AddCommand(newServeCmd(), newConfigCmd(), newDoctorCmd(), newPluginsCmd(), newRecordsCmd(), newBakeCmd(), newVersionCmd())
	return root
}
