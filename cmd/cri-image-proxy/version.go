package main

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "devel"

// revision is the commit, set at build time (-X main.revision=SHA) by the
// Makefile; otherwise Go's VCS stamp is used, when the build had one
// (GOFLAGS=-buildvcs=false, set on some build machines, leaves none).
var revision = ""

// build is what this binary is: its version, the commit it was built from,
// the cri-api it speaks and its Go.
type build struct {
	Version, Revision, CRIAPI, GoVersion string
}

func buildInfo() build {
	b := build{Version: version, Revision: "unknown", CRIAPI: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.GoVersion = bi.GoVersion
	for _, d := range bi.Deps {
		if d.Path == "k8s.io/cri-api" {
			b.CRIAPI = d.Version
		}
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			b.Revision = s.Value
		}
	}
	if revision != "" {
		b.Revision = revision
	}
	return b
}

// buildInfoMetric is cri_image_proxy_build_info, 1, with the build as
// labels: how a fleet's versions are counted.
func buildInfoMetric() prometheus.Collector {
	b := buildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "cri_image_proxy", Name: "build_info",
		Help:        "Always 1; the labels say which build runs: version, revision (the commit), cri_api (k8s.io/cri-api), goversion.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "cri_api": b.CRIAPI, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of cri-image-proxy and of the CRI API it speaks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := buildInfo()
			fmt.Fprintf(cmd.OutOrStdout(), "cri-image-proxy %s (commit %s, CRI v1, k8s.io/cri-api %s, %s)\n", b.Version, b.Revision, b.CRIAPI, b.GoVersion)
			return nil
		},
	}
}
