package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/bake"
	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

type bakeFlags struct {
	plugins       pluginFlags
	images        string
	runtime       string
	dockerConfig  string
	parallel      int
	timeout       time.Duration
	recordDB      string
	recordPreload bool
	allowlistOut  string
	noProgress    bool
}

func newBakeCmd() *cobra.Command {
	var f bakeFlags
	cmd := &cobra.Command{
		Use:   "bake --images FILE",
		Short: "Pull a list of images into the runtime at node-image build time, with the node's credentials",
		Long: `Pull the images listed in FILE (one a line; blank lines and # comments skipped; - for
stdin) straight into the container runtime, with credentials from the credential
provider plugins the node will use (--image-credential-provider-config and -bin-dir, or
--config) or from a docker config.json (--docker-config); at most --parallel at a time.

So that the node booted from the image knows them, either record them in the ensure
database as preloaded (--record-preloaded: every pod of the node may use them, under
every policy) or write a preloadedImagesVerificationAllowlist fragment (--allowlist-out)
for imagePullCredentialsVerificationPolicy NeverVerifyAllowlistedImages. With neither,
NeverVerifyPreloadedImages (the default policy) already treats them as preloaded.

Prints a summary (image, digest, size, provider, time); exits non-zero, listing them,
when any image failed. Running it again pulls only what changed. No secret is printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBake(cmd, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.images, "images", "", "the image list (required; - reads stdin)")
	fl.StringVar(&f.runtime, "runtime-endpoint", config.Default().RuntimeEndpoint, "the runtime's CRI image service (default from --config: its imageEndpoint or runtimeEndpoint)")
	fl.StringVar(&f.dockerConfig, "docker-config", "", "take credentials from this docker config.json instead of plugins")
	fl.IntVar(&f.parallel, "parallel", 4, "pulls at a time")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "bound of one image's pull")
	fl.BoolVar(&f.recordPreload, "record-preloaded", false, "record the images as preloaded in the ensure database")
	fl.StringVar(&f.recordDB, "ensure-database", config.DefaultEnsureDatabase, "the ensure database --record-preloaded writes (default from --config; the daemon must not hold it)")
	fl.StringVar(&f.allowlistOut, "allowlist-out", "", "write a preloadedImagesVerificationAllowlist fragment with the images' repositories to this file")
	fl.BoolVar(&f.noProgress, "no-progress", false, "plain lines instead of a progress bar on a terminal")
	f.plugins.add(cmd)
	_ = cmd.MarkFlagRequired("images")
	return cmd
}

func runBake(cmd *cobra.Command, f *bakeFlags) error {
	ctx := cmd.Context()
	images, err := readImageList(f.images, cmd.InOrStdin())
	if err != nil {
		return err
	}
	if len(images) == 0 {
		return fmt.Errorf("%s lists no image", f.images)
	}
	if err := f.fromProxyConfig(cmd); err != nil {
		return err
	}
	creds, err := f.credentials()
	if err != nil {
		return err
	}
	backend, err := criproxy.Dial(f.runtime, "")
	if err != nil {
		return err
	}
	defer backend.Runtime.Close()

	progress := newBakeProgress(cmd.ErrOrStderr(), len(images), f.noProgress)
	results := bake.Pull(ctx, runtimeapi.NewImageServiceClient(backend.Image), images, bake.Options{
		Parallel: f.parallel, Timeout: f.timeout, Credentials: creds, Progress: progress.report,
	})
	progress.finish()
	printBakeSummary(cmd.OutOrStdout(), results)

	if f.recordPreload {
		if err := recordBaked(cmd.OutOrStdout(), f.recordDB, results); err != nil {
			return err
		}
	}
	if f.allowlistOut != "" {
		if err := writeAllowlist(f.allowlistOut, bake.Repositories(results)); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "wrote the allowlist fragment %s\n", f.allowlistOut)
	}
	if failed := bake.Failed(results); len(failed) > 0 {
		var b strings.Builder
		for _, r := range failed {
			fmt.Fprintf(&b, "\n  %s: %v", r.Image, r.Err)
		}
		return fmt.Errorf("%d of %d image(s) failed:%s", len(failed), len(results), b.String())
	}
	return nil
}

// fromProxyConfig takes the runtime endpoint and the ensure database from
// --config, unless their own flags are given.
func (f *bakeFlags) fromProxyConfig(cmd *cobra.Command) error {
	if f.plugins.proxyConfig == "" {
		return nil
	}
	cfg, err := config.Load(f.plugins.proxyConfig)
	if err != nil {
		return err
	}
	if !cmd.Flags().Changed("runtime-endpoint") {
		f.runtime = cfg.RuntimeEndpoint
		if cfg.ImageEndpoint != "" {
			f.runtime = cfg.ImageEndpoint
		}
	}
	if !cmd.Flags().Changed("ensure-database") {
		f.recordDB = cfg.EnsureSecretPulledImages.DatabasePath
	}
	return nil
}

// credentials are a docker config's, the plugins', or none.
func (f *bakeFlags) credentials() (bake.Credentials, error) {
	switch {
	case f.dockerConfig != "":
		in, err := credplugins.NewFromDockerConfig(f.dockerConfig, credplugins.Options{})
		if err != nil {
			return nil, err
		}
		return in, nil
	case f.plugins.config != "" || f.plugins.proxyConfig != "":
		cfg, err := f.plugins.load()
		if err != nil {
			return nil, err
		}
		in, err := credplugins.New(cfg, credplugins.Options{ExecTimeout: f.plugins.timeout})
		if err != nil {
			return nil, err
		}
		return in, nil
	}
	return nil, nil // anonymous pulls
}

// recordBaked records the images pulled as preloaded in the database at
// path.
func recordBaked(out io.Writer, path string, results []bake.Result) error {
	store, err := records.Open(path, records.Options{})
	if err != nil {
		return err
	}
	err = bake.RecordPreloaded(store, results, time.Now())
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "recorded %d image(s) as preloaded in %s\n", len(results)-len(bake.Failed(results)), path)
	return nil
}

func readImageList(path string, stdin io.Reader) ([]string, error) {
	if path == "-" {
		return bake.ParseList(stdin, "stdin")
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return bake.ParseList(fh, path)
}

// bakeProgress shows the pulls: a progress bar on a terminal, a line per
// image otherwise (build logs).
type bakeProgress struct {
	out io.Writer
	bar *progressbar.ProgressBar
}

func newBakeProgress(out io.Writer, n int, plain bool) *bakeProgress {
	p := &bakeProgress{out: out}
	if fh, ok := out.(*os.File); ok && !plain && term.IsTerminal(int(fh.Fd())) {
		p.bar = progressbar.NewOptions(n, progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("pulling"),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish())
	}
	return p
}

func (p *bakeProgress) report(r bake.Result) {
	if p.bar != nil {
		if r.Done {
			_ = p.bar.Add(1)
		} else {
			p.bar.Describe("pulling " + r.Image)
		}
		return
	}
	switch {
	case !r.Done:
		fmt.Fprintf(p.out, "pulling %s\n", r.Image)
	case r.Err != nil:
		fmt.Fprintf(p.out, "FAILED  %s after %v\n", r.Image, r.Duration.Round(time.Millisecond))
	default:
		fmt.Fprintf(p.out, "pulled  %s in %v\n", r.Image, r.Duration.Round(time.Millisecond))
	}
}

func (p *bakeProgress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

func printBakeSummary(out io.Writer, results []bake.Result) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "IMAGE\tDIGEST\tSIZE\tPROVIDER\tTIME\tRESULT")
	for _, r := range results {
		provider := r.Provider
		if provider == "" {
			provider = "-"
		}
		result, digest, size := "ok", r.Digest, humanSize(r.Size)
		if r.Err != nil {
			result, digest, size, provider = "FAILED", "-", "-", "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\n", r.Image, digest, size, provider, r.Duration.Round(time.Millisecond), result)
	}
	w.Flush()
}

func humanSize(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// writeAllowlist writes the ensureSecretPulledImages fragment of the
// proxy's configuration that lets repos skip verification under
// NeverVerifyAllowlistedImages.
func writeAllowlist(path string, repos []string) error {
	if len(repos) == 0 {
		return errors.New("no image was pulled: no allowlist to write")
	}
	frag := map[string]any{"ensureSecretPulledImages": map[string]any{
		"imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages",
		"preloadedImagesVerificationAllowlist":   repos,
	}}
	b, err := yaml.Marshal(frag)
	if err != nil {
		return err
	}
	head := "# Written by cri-image-proxy bake: the repositories of the baked images.\n" +
		"# Merge into /etc/cri-image-proxy/config.yaml.\n"
	return os.WriteFile(path, append([]byte(head), b...), 0o644)
}
