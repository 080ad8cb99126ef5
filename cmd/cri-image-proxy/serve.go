package main

import (
	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/daemon"
)

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve CRI on a unix socket, forwarding to the container runtime",
		Args:  cobra.NoArgs,
	}
	configPath := addConfigFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		load := func() (*config.ProxyConfiguration, error) { return loadServeConfig(cmd.Flags(), *configPath) }
		cfg, err := load()
		if err != nil {
			return err
		}
		return daemon.Run(cmd.Context(), cfg, daemon.Options{Reload: load, ConfigPath: *configPath, Version: version, BuildInfo: buildInfoMetric()})
	}
	return cmd
}
