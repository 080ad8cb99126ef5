package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// recordsFlags say where the records are: the daemon's admin socket, else
// the database file (and the runtime, for what needs it).
type recordsFlags struct {
	configPath  string
	adminSocket string
	database    string
	runtime     string
	policy      string
}

func newRecordsCmd() *cobra.Command {
	var f recordsFlags
	cmd := &cobra.Command{
		Use:   "records",
		Short: "Inspect and revoke the ensure-secret-pulled-images records",
		Long: `Inspect and revoke the records of verified pulls (KEP-2535). While the daemon runs,
the commands go through its admin socket; otherwise they open the database file
directly (and the container runtime, for explain and gc).`,
	}
	d := config.Default()
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.configPath, "config", "", "take the paths and policy from this proxy configuration file")
	pf.StringVar(&f.adminSocket, "admin-socket", d.EnsureSecretPulledImages.AdminSocket, "the daemon's admin socket")
	pf.StringVar(&f.database, "database", d.EnsureSecretPulledImages.DatabasePath, "the database file, when the daemon does not run")
	pf.StringVar(&f.runtime, "runtime-endpoint", d.RuntimeEndpoint, "the container runtime, when the daemon does not run")
	pf.StringVar(&f.policy, "policy", d.EnsureSecretPulledImages.ImagePullCredentialsVerificationPolicy, "the policy explain assumes, when the daemon does not run")

	cmd.AddCommand(
		&cobra.Command{Use: "list", Short: "List the records", Args: cobra.NoArgs,
			RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
				ex, err := a.List(ctx)
				if err != nil {
					return err
				}
				printRecords(out, ex)
				return nil
			})},
		&cobra.Command{Use: "show IMAGE", Short: "Show the record of an image (a name or its ID), as JSON", Args: cobra.ExactArgs(1),
			RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
				ref, err := a.Resolve(ctx, args[0])
				if err != nil {
					return err
				}
				r, err := a.Get(ctx, ref)
				if err != nil {
					return err
				}
				return printJSON(out, r)
			})},
		f.explainCmd(),
		&cobra.Command{Use: "forget IMAGE", Short: "Delete an image's record (with NeverVerifyPreloadedImages a present image then counts as preloaded)", Args: cobra.ExactArgs(1),
			RunE: f.runWrite(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
				ref, err := a.Resolve(ctx, args[0])
				if err != nil {
					return err
				}
				ok, err := a.Forget(ctx, ref)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("no record of %s", ref)
				}
				fmt.Fprintf(out, "forgot %s\n", ref)
				return nil
			})},
		f.revokeCmd(),
		&cobra.Command{Use: "gc", Short: "Drop records of images the runtime no longer lists, and stale grants, now", Args: cobra.NoArgs,
			RunE: f.runWrite(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
				r, err := a.GC(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "dropped %d record(s) and %d grant(s)\n", r.Records, r.Grants)
				return nil
			})},
		&cobra.Command{Use: "export", Short: "Print every record and pull intent as JSON", Args: cobra.NoArgs,
			RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
				ex, err := a.List(ctx)
				if err != nil {
					return err
				}
				return printJSON(out, ex)
			})},
	)
	return cmd
}

func (f *recordsFlags) explainCmd() *cobra.Command {
	var podUID string
	var asJSON bool
	cmd := &cobra.Command{Use: "explain IMAGE", Short: "Say what the proxy decides for an image and a pod, and why", Args: cobra.ExactArgs(1),
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
			e, err := a.Explain(ctx, args[0], podUID)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out, e)
			}
			fmt.Fprintf(out, "image:       %s\n", e.Image)
			fmt.Fprintf(out, "present:     %v %s\n", e.Present, e.ImageRef)
			fmt.Fprintf(out, "repository:  %s\n", orDash(e.Repository))
			fmt.Fprintf(out, "policy:      %s\n", e.Policy)
			if e.Record != nil {
				repos := make([]string, 0, len(e.Record.CredentialMapping))
				for r := range e.Record.CredentialMapping {
					repos = append(repos, r)
				}
				sort.Strings(repos)
				fmt.Fprintf(out, "record:      updated %s, repositories %s\n", e.Record.LastUpdatedTime.Format("2006-01-02T15:04:05Z07:00"), strings.Join(repos, ", "))
			} else {
				fmt.Fprintf(out, "record:      none\n")
			}
			fmt.Fprintf(out, "check:       %s\n", e.Result)
			if podUID != "" {
				if e.GrantsKnown {
					fmt.Fprintf(out, "pod %s: granted=%v\n", podUID, e.PodGranted)
				} else {
					fmt.Fprintf(out, "pod %s: grants are in the daemon's memory; the daemon does not run\n", podUID)
				}
			}
			fmt.Fprintf(out, "verdict:     %s\n", e.Verdict)
			return nil
		})}
	cmd.Flags().StringVar(&podUID, "pod-uid", "", "the pod (sandbox metadata UID) to decide for")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (f *recordsFlags) revokeCmd() *cobra.Command {
	var sa, image string
	cmd := &cobra.Command{Use: "revoke (--service-account NS/NAME | --image IMAGE)", Short: "Revoke verified credentials: of a service account everywhere, or every one of an image", Args: cobra.NoArgs,
		RunE: f.runWrite(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
			switch {
			case (sa == "") == (image == ""):
				return errors.New("give exactly one of --service-account NS/NAME and --image IMAGE")
			case sa != "":
				ns, name, ok := strings.Cut(sa, "/")
				if !ok || ns == "" || name == "" {
					return fmt.Errorf("--service-account %q: want NAMESPACE/NAME", sa)
				}
				r, err := a.RevokeServiceAccount(ctx, ns, name)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "revoked service account %s/%s in %d record(s)\n", ns, name, r.Records)
			default:
				ref, err := a.Resolve(ctx, image)
				if err != nil {
					return err
				}
				r, err := a.RevokeImage(ctx, ref)
				if err != nil {
					return err
				}
				if r.Records == 0 {
					return fmt.Errorf("no record of %s", ref)
				}
				fmt.Fprintf(out, "revoked every credential of %s: every pod must verify again\n", ref)
			}
			return nil
		})}
	cmd.Flags().StringVar(&sa, "service-account", "", "NAMESPACE/NAME")
	cmd.Flags().StringVar(&image, "image", "", "an image name or ID")
	return cmd
}

type recordsFunc = func(ctx context.Context, a admin.Service, out io.Writer, args []string) error

// run wraps a records command that only reads: without the daemon it opens
// the database file read-only.
func (f *recordsFlags) run(do recordsFunc) func(*cobra.Command, []string) error {
	return f.wrap(do, false)
}

// runWrite wraps a records command that changes records.
func (f *recordsFlags) runWrite(do recordsFunc) func(*cobra.Command, []string) error {
	return f.wrap(do, true)
}

// wrap picks the backend for a records command and closes it after.
func (f *recordsFlags) wrap(do recordsFunc, write bool) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a, closeFn, err := f.admin(cmd, write)
		if err != nil {
			return err
		}
		defer closeFn()
		return do(cmd.Context(), a, cmd.OutOrStdout(), args)
	}
}

// admin returns the daemon's admin API when it answers, else a local one
// on the database file: read-only unless write, and never a new, empty
// file where the database is missing.
func (f *recordsFlags) admin(cmd *cobra.Command, write bool) (admin.Service, func(), error) {
	if f.configPath != "" {
		cfg, err := config.Load(f.configPath)
		if err != nil {
			return nil, nil, err
		}
		e := cfg.EnsureSecretPulledImages
		if !cmd.Flags().Changed("admin-socket") {
			f.adminSocket = e.AdminSocket
		}
		if !cmd.Flags().Changed("database") {
			f.database = e.DatabasePath
		}
		if !cmd.Flags().Changed("runtime-endpoint") {
			f.runtime = cfg.RuntimeEndpoint
		}
		if !cmd.Flags().Changed("policy") {
			f.policy = e.ImagePullCredentialsVerificationPolicy
		}
	}
	if c, err := admin.Dial(f.adminSocket); err == nil {
		return c, func() {}, nil
	}
	if _, err := os.Stat(f.database); err != nil {
		return nil, nil, fmt.Errorf("the daemon does not answer on %s, and there is no records database at %s (%w): is --database right, and has the daemon run with ensureSecretPulledImages on?", f.adminSocket, f.database, err)
	}
	store, err := records.Open(f.database, records.Options{ReadOnly: !write})
	if err != nil {
		return nil, nil, fmt.Errorf("the daemon does not answer on %s, and %w", f.adminSocket, err)
	}
	local := &admin.Local{Store: store}
	closers := []func(){func() { store.Close() }}
	if backend, err := criproxy.Dial(f.runtime, ""); err == nil {
		closers = append(closers, func() { backend.Close() })
		policy, err := ensure.NewPolicy(ensure.PolicyName(f.policy), nil)
		if err != nil {
			return nil, nil, err
		}
		core, err := ensure.NewDecider(store, policy, ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime)))
		if err != nil {
			return nil, nil, err
		}
		local.Core = core
	}
	return local, func() {
		for _, c := range closers {
			c()
		}
	}, nil
}

func printRecords(out io.Writer, ex *admin.Export) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "IMAGE ID\tREPOSITORY\tCREDENTIALS\tSERVICE ACCOUNTS\tNODE-WIDE\tUPDATED")
	sort.Slice(ex.Records, func(i, j int) bool { return ex.Records[i].ImageRef < ex.Records[j].ImageRef })
	for _, r := range ex.Records {
		repos := make([]string, 0, len(r.CredentialMapping))
		for repo := range r.CredentialMapping {
			repos = append(repos, repo)
		}
		sort.Strings(repos)
		for _, repo := range repos {
			c := r.CredentialMapping[repo]
			var sas []string
			for _, sa := range c.KubernetesServiceAccounts {
				sas = append(sas, sa.Namespace+"/"+sa.Name)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%v\t%s\n", shortRef(r.ImageRef), repo, len(c.KubernetesSecrets), orDash(strings.Join(sas, ",")), c.NodePodsAccessible, r.LastUpdatedTime.Format("2006-01-02T15:04:05Z"))
		}
	}
	w.Flush()
	fmt.Fprintf(out, "%d record(s), %d pull(s) in flight", len(ex.Records), len(ex.Intents))
	if len(ex.Undecoded) > 0 {
		fmt.Fprintf(out, ", %d undecodable (they need verification): %s", len(ex.Undecoded), strings.Join(ex.Undecoded, " "))
	}
	fmt.Fprintln(out)
}

func shortRef(ref string) string {
	if len(ref) > 19 {
		return ref[:19]
	}
	return ref
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
