package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "devel"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of cri-image-proxy and of the CRI API it speaks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cri := "unknown"
			goVersion := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
				for _, d := range bi.Deps {
					if d.Path == "k8s.io/cri-api" {
						cri = d.Version
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cri-image-proxy %s (CRI v1, k8s.io/cri-api %s, %s)\n", version, cri, goVersion)
			return nil
		},
	}
}
