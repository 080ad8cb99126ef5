package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check or print the configuration serve would run with (the file and the same flags)",
	}
	cmd.AddCommand(newConfigValidateCmd(), newConfigDumpCmd())
	return cmd
}

// configCmd is a config subcommand: it takes --config and every serve
// flag, and loads them as serve does.
func configCmd(use, short, long string, extra func(*cobra.Command), run func(cmd *cobra.Command, cfg *config.ProxyConfiguration) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.NoArgs}
	configPath := addConfigFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadServeConfig(cmd.Flags(), *configPath)
		if err != nil {
			return err
		}
		return run(cmd, cfg)
	}
	if extra != nil {
		extra(cmd)
	}
	return cmd
}

func newConfigValidateCmd() *cobra.Command {
	var strict bool
	return configCmd("validate", "Check the whole configuration: the file, the flags, the plugins, the kubeconfig and the records database",
		`Check everything serve would load, reporting every problem: the configuration (file and
flags), the credential provider config and its plugin executables, the kubeconfig, the
ensure policy, and the records database. A deprecated field (still read) is a warning that
names the field to use instead.

A records database that cannot be opened is a warning: serve starts anyway (the runtime
must stay up) and refuses every image that needs verification until it is fixed. With
--strict it is an error, for rollouts that must not go ahead on such a node. Exits
non-zero when anything is an error.`,
		func(cmd *cobra.Command) {
			cmd.Flags().BoolVar(&strict, "strict", false, "treat a records database that cannot be opened as an error")
		},
		func(cmd *cobra.Command, cfg *config.ProxyConfiguration) error {
			problems := validateConfig(cmd.OutOrStdout(), cfg, strict)
			if problems > 0 {
				return fmt.Errorf("%d problem(s)", problems)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "valid")
			return nil
		})
}

// validateConfig checks each part of cfg that serve loads at start and
// prints a line per check; it returns how many failed.
func validateConfig(out io.Writer, cfg *config.ProxyConfiguration, strict bool) (problems int) {
	report := func(what string, err error, warnOnly bool) {
		switch {
		case err == nil:
			fmt.Fprintf(out, "ok    %s\n", what)
		case warnOnly && !strict:
			fmt.Fprintf(out, "warn  %s: %v\n", what, err)
		default:
			fmt.Fprintf(out, "FAIL  %s: %v\n", what, err)
			problems++
		}
	}
	report("configuration", nil, false) // loadServeConfig validated it
	for _, d := range cfg.Deprecations() {
		// A warning whatever --strict says: serve reads the field.
		fmt.Fprintf(out, "warn  %s\n", d)
	}
	if cp := cfg.CredentialProviders; cp != nil {
		pc, err := credplugins.LoadConfig(cp.Config, cp.BinDir)
		what := "credential providers " + cp.Config
		if err == nil {
			what += fmt.Sprintf(" (%d provider(s), hash %s)", len(pc.Providers), pc.Hash)
		}
		report(what, err, false)
	}
	if ip := cfg.ImagePolicy; ip != nil {
		pc, err := imagepolicy.LoadConfig(ip.Config, ip.BinDir)
		what := "image policy " + ip.Config
		if err == nil {
			what += fmt.Sprintf(" (%d provider(s), hash %s)", len(pc.Providers), pc.Hash)
		}
		report(what, err, false)
	}
	if sm := cfg.Monitoring.Secure; sm != nil && sm.CertFile != "" {
		_, err := tls.LoadX509KeyPair(sm.CertFile, sm.KeyFile)
		report("secure monitoring certificate "+sm.CertFile, err, false)
	}
	if k := cfg.Kubernetes; k != nil {
		var err error
		what := "kubeconfig " + k.Kubeconfig
		if k.Kubeconfig != "" {
			_, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
		} else {
			what = "in-cluster Kubernetes API"
			_, err = rest.InClusterConfig()
		}
		report(what, err, false)
	}
	if e := cfg.EnsureSecretPulledImages; e.Enabled {
		_, err := decision.NewPolicy(decision.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)
		report("ensure policy "+e.ImagePullCredentialsVerificationPolicy, err, false)
		what, err := checkDatabase(e.DatabasePath)
		report(what, err, true)
		if e.AdminGroup != "" {
			_, err := unixsock.LookupGroup(e.AdminGroup)
			if err != nil {
				err = fmt.Errorf("ensureSecretPulledImages.adminGroup: %w", err)
			}
			report("admin group "+e.AdminGroup, err, false)
		}
	}
	return problems
}

// checkDatabase opens the records database read-only, as the records
// commands do, to tell whether serve could open it.
func checkDatabase(path string) (string, error) {
	what := "records database " + path
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return what + " (absent: serve creates it)", nil
	}
	s, err := records.Open(path, records.Options{ReadOnly: true})
	if errors.Is(err, records.ErrLocked) {
		return what + " (in use by a running cri-image-proxy, which opened it)", nil
	}
	if err != nil {
		return what, fmt.Errorf("%w; serve would run, refusing every image that needs verification", err)
	}
	s.Close()
	return what, nil
}

func newConfigDumpCmd() *cobra.Command {
	return configCmd("dump", "Print the effective configuration (the file with the flags applied, defaults filled) as YAML",
		`Print the configuration serve would run with, defaults filled and flags applied, as a
`+config.APIVersion+` `+config.Kind+` that serve --config accepts. A deprecated field is
printed where its successor is (a warning on standard error says so).`,
		nil,
		func(cmd *cobra.Command, cfg *config.ProxyConfiguration) error {
			for _, d := range cfg.Deprecations() {
				fmt.Fprintf(cmd.ErrOrStderr(), "config dump: %s is deprecated: printed as %s\n", d.Field, d.Use)
			}
			cfg.DropDeprecated()
			data, err := yaml.Marshal(cfg)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		})
}
