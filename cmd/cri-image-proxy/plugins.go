package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// pluginFlags say where the credential provider configuration is: the
// kubelet-style flags, or the proxy's configuration file.
type pluginFlags struct {
	proxyConfig string
	config      string
	binDir      string
	timeout     time.Duration
}

func (f *pluginFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.config, "image-credential-provider-config", "", "the kubelet's CredentialProviderConfig, a file or a directory")
	fl.StringVar(&f.binDir, "image-credential-provider-bin-dir", "", "the directory of the plugin executables")
	fl.StringVar(&f.proxyConfig, "config", "", "take both from this proxy configuration file (credentialProviders)")
	fl.DurationVar(&f.timeout, "exec-timeout", credplugins.DefaultExecTimeout, "timeout of one plugin run")
}

// load returns the credential provider configuration the flags point at.
func (f *pluginFlags) load() (*credplugins.Config, error) {
	path, bin := f.config, f.binDir
	if f.proxyConfig != "" {
		cfg, err := config.Load(f.proxyConfig)
		if err != nil {
			return nil, err
		}
		if cfg.CredentialProviders == nil {
			return nil, fmt.Errorf("config %s has no credentialProviders section", f.proxyConfig)
		}
		if path == "" {
			path = cfg.CredentialProviders.Config
		}
		if bin == "" {
			bin = cfg.CredentialProviders.BinDir
		}
	}
	if path == "" || bin == "" {
		return nil, fmt.Errorf("give --image-credential-provider-config and --image-credential-provider-bin-dir, or --config")
	}
	return credplugins.LoadConfig(path, bin)
}

func newPluginsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "Check and try the credential provider and image policy plugins",
	}
	cmd.AddCommand(newPluginsValidateCmd(), newPluginsTestCmd())
	return cmd
}

func newPluginsValidateCmd() *cobra.Command {
	var f pluginFlags
	var pf policyFlags
	cmd := &cobra.Command{
		Use:   "validate [CONFIG]",
		Short: "Validate a CredentialProviderConfig as the proxy (and the kubelet) would load it",
		Long: `Validate a CredentialProviderConfig (a file or a directory, kubelet.config.k8s.io
v1, v1beta1 or v1alpha1) and list its providers. Exits non-zero with every problem,
each naming the file, the provider and the field.

With --image-policy-config and --image-policy-bin-dir, validate an ImagePolicyConfig
and list its image policy providers instead.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if pf.enabled() {
				return policyValidate(cmd.OutOrStdout(), &pf)
			}
			if len(args) == 1 {
				f.config = args[0]
			}
			cfg, err := f.load()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PROVIDER\tAPI VERSION\tDEFAULT CACHE\tMATCH IMAGES\tFILE")
			for _, p := range cfg.Providers {
				api := strings.TrimPrefix(p.APIVersion, "credentialprovider.kubelet.k8s.io/")
				fmt.Fprintf(w, "%s\t%s\t%v\t%s\t%s\n", p.Name, api, p.DefaultCacheDuration, strings.Join(p.MatchImages, ","), p.File)
			}
			w.Flush()
			fmt.Fprintf(cmd.OutOrStdout(), "valid: %d provider(s), config hash %s\n", len(cfg.Providers), cfg.Hash)
			return nil
		},
	}
	f.add(cmd)
	pf.add(cmd, false)
	return cmd
}

func newPluginsTestCmd() *cobra.Command {
	var f pluginFlags
	var pf policyFlags
	cmd := &cobra.Command{
		Use:   "test IMAGE",
		Short: "Run the plugins that match IMAGE and show what a pull would try",
		Long: `Show which providers match IMAGE, run them (no cache), and print each answer's
cache key type, cache duration and usernames, never passwords, then the candidates in
the order a pull without credentials tries them.

With --image-policy-config and --image-policy-bin-dir, run the image policy providers
that apply to IMAGE in --namespace instead (no cache), and print each verdict with its
reasons for the operator and for the pod; it exits non-zero when the image is refused.
IMAGE is repository@digest (the digest the registry resolves the tag to), or a name with
--digest, or an image ID with --image-id for the check at container create.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if pf.enabled() {
				return policyTest(cmd.Context(), cmd.OutOrStdout(), cmd.InOrStdin(), &pf, args[0])
			}
			cfg, err := f.load()
			if err != nil {
				return err
			}
			return pluginsTest(cmd.Context(), cmd.OutOrStdout(), cfg, args[0], f.timeout)
		},
	}
	f.add(cmd)
	pf.add(cmd, true)
	return cmd
}

// pluginsTest is plugins test: a fresh Injector (empty caches), so every
// matching plugin really runs.
func pluginsTest(ctx context.Context, out io.Writer, cfg *credplugins.Config, image string, timeout time.Duration) error {
	repo, ok := imageref.Repository(image)
	if !ok {
		return fmt.Errorf("%q is not an image reference", image)
	}
	fmt.Fprintf(out, "image %s: plugins get the repository %s\n\n", image, repo)
	in, err := credplugins.New(cfg, credplugins.Options{ExecTimeout: timeout})
	if err != nil {
		return err
	}
	for _, p := range cfg.Providers {
		var matched []string
		for _, m := range p.MatchImages {
			if keyring.MatchImage(m, repo) {
				matched = append(matched, m)
			}
		}
		if len(matched) == 0 {
			fmt.Fprintf(out, "provider %s: does not match (matchImages %s)\n", p.Name, strings.Join(p.MatchImages, ", "))
		} else {
			fmt.Fprintf(out, "provider %s: matches (%s)\n", p.Name, strings.Join(matched, ", "))
		}
	}
	start := time.Now()
	cands, answers, failed := in.Lookup(ctx, repo, nil)
	fmt.Fprintf(out, "\nran the matching plugins in %v\n", time.Since(start).Round(time.Millisecond))
	for _, a := range answers {
		cache := fmt.Sprintf("cached %v under its %s key", a.CacheDuration, a.CacheKeyType)
		if a.CacheDuration == 0 {
			cache = "not cached (duration 0)"
		}
		fmt.Fprintf(out, "provider %s answered: cacheKeyType %s, %s, %d auth entr(y/ies):\n", a.Provider, a.CacheKeyType, cache, len(a.Auth))
		keys := make([]string, 0, len(a.Auth))
		for k := range a.Auth {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(out, "  %-40q username %q (password not shown)\n", k, a.Auth[k].Username)
		}
	}
	for _, e := range failed {
		fmt.Fprintf(out, "provider %s failed: %v\n", e.Provider, e.Err)
	}
	fmt.Fprintln(out)
	if len(cands) == 0 {
		fmt.Fprintln(out, "no candidate credential: a pull without credentials goes to the registry anonymously")
	} else {
		fmt.Fprintln(out, "candidates, in the order a pull without credentials tries them:")
		for i, c := range cands {
			fmt.Fprintf(out, "  %d. provider %s, key %q, username %q\n", i+1, c.Provider, c.Key, c.Credential.Username)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d provider(s) failed", len(failed))
	}
	return nil
}
