package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	digest "github.com/opencontainers/go-digest"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/kubeletrecords"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
)

// recordsFlags say where the records are: the daemon's admin socket, else
// the database file (and the runtime, for what needs it).
type recordsFlags struct {
	configPath  string
	adminSocket string
	database    string
	runtime     string
	policy      string
	expiry      *ensure.Expiry // from --config: the records' maximum age
}

func newRecordsCmd() *cobra.Command {
	var f recordsFlags
	cmd := &cobra.Command{
		Use:   "records",
		Short: "Inspect and revoke the ensure-secret-pulled-images records",
		Long: `Inspect and revoke the records of verified pulls (KEP-2535). While the daemon runs,
the commands go through its admin socket; otherwise they open the database file
directly (and the container runtime, for explain and gc). import and restore need the
daemon stopped.`,
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
		f.showCmd(),
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
		f.exportCmd(),
		f.importCmd(),
		f.restoreCmd(),
	)
	return cmd
}

func (f *recordsFlags) showCmd() *cobra.Command {
	var ages bool
	cmd := &cobra.Command{Use: "show IMAGE [--ages]", Short: "Show the record of an image (a name or its ID), as JSON; --ages: each credential's age and expiry", Args: cobra.ExactArgs(1),
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
			ref, err := a.Resolve(ctx, args[0])
			if err != nil {
				return err
			}
			if !ages {
				r, err := a.Get(ctx, ref)
				if err != nil {
					return err
				}
				return printJSON(out, r)
			}
			list, err := a.Ages(ctx, ref)
			if err != nil {
				return err
			}
			printAges(out, list, time.Now())
			return nil
		})}
	cmd.Flags().BoolVar(&ages, "ages", false, "list each verified credential with when it was verified, its age, the maximum record age and whether it expired")
	return cmd
}

// printAges prints credential ages as a table.
func printAges(out io.Writer, list []ensure.CredentialAge, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "REPOSITORY\tCREDENTIAL\tVERIFIED\tAGE\tMAX AGE\tEXPIRED")
	for _, a := range list {
		verified, age, max := "unknown (before ages were kept)", "-", "none"
		if !a.VerifiedAt.IsZero() {
			verified, age = a.VerifiedAt.UTC().Format(time.RFC3339), now.Sub(a.VerifiedAt).Round(time.Second).String()
		}
		if a.MaxAge > 0 {
			max = a.MaxAge.String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\n", a.Repository, a.Credential, verified, age, max, a.Expired)
	}
	w.Flush()
}

func (f *recordsFlags) exportCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{Use: "export [--format kubelet DIR]", Short: "Print every record and pull intent as JSON, or write them as the kubelet's own records",
		Long: `Print every record, preloaded record and pull intent as JSON; with --format kubelet, write
them into DIR in the kubelet's own layout (DIR/pulled, DIR/pulling, DIR/observed-preloaded: the
kubelet's <root-dir>/image_manager), to hand a node's enforcement to a kubelet with
KubeletEnsureSecretPulledImages. Stop the kubelet first: it reads the files at its start. A record
the kubelet already has is merged, not replaced. Pull secrets cross by their coordinates (the
kubelet matches them so, as the proxy does); a credential the proxy knows only by its salted hash
cannot cross, and its pods verify again. Preloaded names cross as the kubelet keeps them, by
repository, except a repository the image was also pulled as (the kubelet cannot tell its
preloaded tags from a tenant's): those names need verification under the kubelet.`,
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
			ex, err := a.List(ctx)
			if err != nil {
				return err
			}
			if format == "json" {
				return printJSON(out, ex)
			}
			var intents []string
			for _, in := range ex.Intents {
				if in.Image != "" {
					intents = append(intents, in.Image)
				}
			}
			rep, err := kubeletrecords.Write(args[0], ex.Records, ex.Preloaded, intents)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "wrote %d record(s), %d preloaded record(s) and %d intent(s) to %s in the kubelet's layout\n", rep.Records, rep.Preloaded, rep.Intents, args[0])
			if rep.PreloadedLeftOut > 0 {
				fmt.Fprintf(out, "%d preloaded name(s) were not written: their image was also pulled as their repository, and the kubelet keeps preloaded repositories, not tags; under the kubelet they need verification\n", rep.PreloadedLeftOut)
			}
			fmt.Fprintf(out, "%d pull secret(s) carried by their coordinates\n", rep.SecretsByCoordinates)
			if rep.HashOnlySecrets > 0 {
				fmt.Fprintf(out, "%d credential(s) known only by their salted hash were not carried: the pods that used them verify again under the kubelet\n", rep.HashOnlySecrets)
			}
			if len(ex.Undecoded) > 0 {
				fmt.Fprintf(out, "%d record(s) of the database could not be read and were not written: %s\n", len(ex.Undecoded), strings.Join(ex.Undecoded, ", "))
			}
			return nil
		})}
	cmd.Args = func(_ *cobra.Command, args []string) error { return checkFormat(format, args) }
	cmd.Flags().StringVar(&format, "format", "json", "json (to standard output) or kubelet (into DIR)")
	return cmd
}

func (f *recordsFlags) importCmd() *cobra.Command {
	var format string
	var create bool
	cmd := &cobra.Command{Use: "import --format kubelet DIR", Short: "Read a kubelet's own records into the database (the daemon stopped)",
		Long: `Read the records, preloaded records and pull intents a kubelet keeps in DIR (its
<root-dir>/image_manager) into the database, merged with the records it has, so that a node
moving from the kubelet's enforcement to the proxy's neither treats its images as preloaded nor
pulls everything again, and its preloaded images stay free by the names the runtime lists them
under in the repositories the kubelet observed them as.
The kubelet's pull secret hashes cannot be carried (the schemes differ): those images stay
"pulled with credentials" and the pods that used the secrets verify again, once. Service
accounts and node-wide pulls carry over. A record that names no repository (the kubelet's
settled pull intents: every pod verifies) is recorded, with no credential, for every
repository the runtime (--runtime-endpoint) lists its image under; if there are such records
and the runtime cannot be asked, nothing is imported. The daemon must be stopped: it holds the
database.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "kubelet" {
				return fmt.Errorf("--format %q: import reads only the kubelet's format (--format kubelet)", format)
			}
			if err := f.loadConfig(cmd); err != nil {
				return err
			}
			if _, err := admin.Dial(f.adminSocket); err == nil {
				return fmt.Errorf("the daemon answers on %s and holds the database: stop it, import, then start it", f.adminSocket)
			}
			if _, err := os.Stat(f.database); errors.Is(err, os.ErrNotExist) && !create {
				return fmt.Errorf("there is no records database at %s: is --database right? (--create makes a new one, for a node whose proxy has not run yet)", f.database)
			}
			recs, intents, rep, err := kubeletrecords.Read(args[0])
			if err != nil {
				return fmt.Errorf("reading the kubelet's records: %w (nothing imported)", err)
			}
			pre, skipped, err := kubeletrecords.ReadPreloaded(args[0])
			if err != nil {
				return fmt.Errorf("reading the kubelet's preloaded records: %w (nothing imported)", err)
			}
			rep.Skipped += skipped
			store, err := records.Open(f.database, records.Options{})
			if err != nil {
				return err
			}
			defer store.Close()
			res, err := kubeletrecords.Import(store, recs, pre, intents, func() ([]records.Image, error) { return f.nodeImages(cmd.Context()) })
			if errors.Is(err, kubeletrecords.ErrRepositoriesUnknown) {
				return fmt.Errorf("%w\nstart the runtime (or give --runtime-endpoint) and import again; until then do not start the proxy with these images on the node under NeverVerifyPreloadedImages: it would take them for preloaded ones", err)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "imported %d record(s) (%d merged with the database's) and %d intent(s) into %s\n", rep.Records, res.Merged, rep.Intents, f.database)
			if res.Unmapped > 0 {
				fmt.Fprintf(out, "%d record(s) of the kubelet named no repository (pulled, every pod verifies): recorded as pulled with no verified credential for the %d repositories the runtime lists their images under", res.Unmapped, res.Repositories)
				if res.NoRepository > 0 {
					fmt.Fprintf(out, "; %d of them still name none (their image is not on the node, or has no name)", res.NoRepository)
				}
				fmt.Fprintln(out)
			}
			if len(pre) > 0 {
				fmt.Fprintf(out, "%d preloaded record(s) of the kubelet gave their images %d preloaded name(s)", len(pre), res.PreloadedNames)
				if res.PreloadedLeftOut > 0 {
					fmt.Fprintf(out, "; %d repositories were not carried (pulled as them too, not on the node, no record, or the runtime could not say): their names need verification", res.PreloadedLeftOut)
				}
				if res.PreloadedUnasked != nil {
					fmt.Fprintf(out, " (the runtime: %v)", res.PreloadedUnasked)
				}
				fmt.Fprintln(out)
			}
			if rep.SecretsNotCarried > 0 {
				fmt.Fprintf(out, "%d pull secret credential(s) of the kubelet were not carried (the hash schemes differ): their images need verification, once, by the pods that use them\n", rep.SecretsNotCarried)
			}
			if rep.Skipped > 0 {
				fmt.Fprintf(out, "%d file(s) skipped, as the kubelet skips them (temporary or foreign names)\n", rep.Skipped)
			}
			return nil
		}}
	cmd.Flags().StringVar(&format, "format", "", "the records' format: kubelet")
	cmd.Flags().BoolVar(&create, "create", false, "create the database when it does not exist")
	return cmd
}

func (f *recordsFlags) restoreCmd() *cobra.Command {
	var preloaded []string
	var preloadedFrom string
	var forgetIntents bool
	cmd := &cobra.Command{Use: "restore FILE [--preloaded IMAGE]... [--preloaded-from LIST]", Short: "Install a backup of the database (the daemon stopped); images it does not know verify once",
		Long: `Install FILE, a copy of the records database, in place of the database. Every image on the
node (asked of the runtime, --runtime-endpoint) that the backup does not know, as a whole or as
one of the repositories it is listed under, is recorded as pulled with no verified credential:
every pod verifies it once, as for a pull whose credential is unknown. An older backup thus never
makes an image pulled since it was taken pass for a preloaded one. Name the images that really
are preloaded with --preloaded (a name: that repository of the image; an ID: the whole image) or
--preloaded-from (a file, one a line, # comments): they are left as the backup has them.

The names images on the node had before their first recorded pull (their preloaded names) are
carried from the database it replaces: they stay free to all pods, whatever the backup's age.

The backup is checked, copied beside the database, migrated and marked there, synced, then
renamed over the database; the file it replaces is kept beside it as
<database>.before-restore-<time>. Nothing changes if the runtime cannot be asked, a --preloaded
image is not on the node, or the backup is not a whole database.

The daemon must be stopped (systemctl stop cri-image-proxy): it holds the database, and its
records in memory would outlive the restore. Start it afterwards; the pull intents the backup
holds are settled then, as after a crash.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.loadConfig(cmd); err != nil {
				return err
			}
			if _, err := admin.Dial(f.adminSocket); err == nil {
				return fmt.Errorf("the daemon answers on %s and holds the database: stop it (systemctl stop cri-image-proxy), restore, then start it (nothing restored)", f.adminSocket)
			}
			names, err := readPreloaded(preloaded, preloadedFrom)
			if err != nil {
				return fmt.Errorf("%w (nothing restored)", err)
			}
			images, err := f.nodeImages(cmd.Context())
			if err != nil {
				return fmt.Errorf("the images on the node must be known to mark those the backup does not know: %w (nothing restored; start the runtime, or give --runtime-endpoint)", err)
			}
			present, err := records.WithoutPreloaded(images, names)
			if err != nil {
				return fmt.Errorf("--preloaded %w (nothing restored)", err)
			}
			layers, err := f.preloadedLayers(cmd.Context(), images, present)
			if err != nil {
				return fmt.Errorf("%w (nothing restored)", err)
			}
			rep, err := records.Restore(f.database, args[0], present, time.Now(), records.RestoreOptions{ForgetUnreadableIntents: forgetIntents, Preloaded: layers})
			if errors.Is(err, records.ErrIntentsUnreadable) {
				return fmt.Errorf("%w (nothing restored): wait until no pull is in flight (crictl images no longer changes), then run again with --forget-unreadable-intents", err)
			}
			if err != nil {
				return fmt.Errorf("%w (nothing restored)", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "restored %s into %s\n", args[0], f.database)
			if rep.Kept != "" {
				fmt.Fprintf(out, "the database it replaced is kept as %s\n", rep.Kept)
			}
			fmt.Fprintf(out, "%d image(s) on the node the backup did not know (%d repositories) recorded as pulled with no verified credential: every pod verifies them once\n", rep.Images, rep.Repositories)
			if len(names) > 0 {
				fmt.Fprintf(out, "left as the backup has them, named preloaded: %s\n", strings.Join(names, ", "))
			}
			if rep.Unreadable > 0 {
				fmt.Fprintf(out, "%d record(s) of the backup could not be read and were left: their images need verification\n", rep.Unreadable)
			}
			if rep.Intents > 0 {
				fmt.Fprintf(out, "%d pull intent(s) of the database it replaced carried over: the next start settles them\n", rep.Intents)
			}
			if rep.PreloadedCarried > 0 {
				fmt.Fprintf(out, "the preloaded names of %d image(s) on the node, from the database it replaced, carried over: they stay free to all pods\n", rep.PreloadedCarried)
			}
			if rep.IntentsLost != "" {
				fmt.Fprintf(out, "the pull intents of the database it replaced could not be read (%s) and were forgotten, as --forget-unreadable-intents asked\n", rep.IntentsLost)
			}
			return nil
		}}
	cmd.Flags().StringArrayVar(&preloaded, "preloaded", nil, "an image on the node that is preloaded (a name, or an ID for all its names); repeat for more")
	cmd.Flags().StringVar(&preloadedFrom, "preloaded-from", "", "a file of preloaded images, one a line (# comments)")
	cmd.Flags().BoolVar(&forgetIntents, "forget-unreadable-intents", false, "replace a database whose pull intents cannot be read (pulls in flight at its last use are then not tracked)")
	return cmd
}

// readPreloaded joins --preloaded and the lines of --preloaded-from.
func readPreloaded(flags []string, file string) ([]string, error) {
	names := slices.Clone(flags)
	if file == "" {
		return names, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--preloaded-from: %w", err)
	}
	return append(names, records.ParsePreloadedList(data)...), nil
}

// checkFormat checks export's format and its argument.
func checkFormat(format string, args []string) error {
	switch {
	case format == "json" && len(args) == 0, format == "kubelet" && len(args) == 1:
		return nil
	case format == "kubelet":
		return errors.New("--format kubelet writes into a directory: give DIR (the kubelet's <root-dir>/image_manager)")
	case format == "json":
		return errors.New("--format json prints to standard output: no DIR")
	default:
		return fmt.Errorf("--format %q: want json or kubelet", format)
	}
}

func (f *recordsFlags) explainCmd() *cobra.Command {
	var podUID, namespace string
	var asJSON bool
	cmd := &cobra.Command{Use: "explain IMAGE", Short: "Say what the proxy decides for an image and a pod, and why", Args: cobra.ExactArgs(1),
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
			e, err := a.Explain(ctx, args[0], podUID)
			if err != nil {
				return err
			}
			var pe *ensure.PolicyExplanation
			if namespace != "" {
				if pe, err = a.ExplainPolicy(ctx, args[0], namespace); err != nil {
					return err
				}
			}
			if asJSON {
				if pe != nil {
					return printJSON(out, map[string]any{"ensure": e, "imagePolicy": pe})
				}
				return printJSON(out, e)
			}
			defer printPolicyExplanation(out, pe)
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
			if len(e.Preloaded) > 0 {
				fmt.Fprintf(out, "preloaded:   %s (listed so before its first recorded pull)\n", strings.Join(e.Preloaded, ", "))
			}
			if e.LayersSeen != nil {
				fmt.Fprintf(out, "layers:      %d, known since %s", len(e.Layers), e.LayersSeen.Format("2006-01-02T15:04:05Z07:00"))
				if len(e.Vouched) > 0 {
					fmt.Fprintf(out, "; every one vouched for by %s", strings.Join(e.Vouched, ", "))
				}
				fmt.Fprintln(out)
			}
			for _, v := range e.Verifications {
				by := "the registry"
				if v.Vouched {
					by = "a mirror vouched for"
				}
				fmt.Fprintf(out, "verified:    %s at %s by %s (%s), %s credential, %d blobs checked, %d requests\n",
					v.Repository, v.At.Format("2006-01-02T15:04:05Z07:00"), by, v.Endpoint, v.CredentialKind, v.Blobs, v.Requests)
				for _, b := range v.CheckedBlobs {
					fmt.Fprintf(out, "             blob present: %s\n", b)
				}
				if more := v.Blobs - len(v.CheckedBlobs); len(v.CheckedBlobs) > 0 && more > 0 {
					fmt.Fprintf(out, "             and %d more (manifests, or past %d)\n", more, pullreport.MaxListedBlobs)
				}
				for _, l := range v.ProvenLayers {
					fmt.Fprintf(out, "             layer proven by its bytes: %s\n", l)
				}
				if len(v.ProvenLayers) > 0 {
					fmt.Fprintf(out, "             (%d bytes fetched to prove them: the node shared them from another image)\n", v.ProvenBytes)
				}
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
	cmd.Flags().StringVar(&namespace, "namespace", "", "also say what the daemon's image policy decides for a container of this namespace, and what it has cached")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printPolicyExplanation prints what the image policy would decide, one
// block per repository the image is decided as; nothing for nil.
func printPolicyExplanation(out io.Writer, pe *ensure.PolicyExplanation) {
	if pe == nil {
		return
	}
	for _, as := range pe.As {
		x := as.Explanation
		fmt.Fprintf(out, "image policy: namespace %s, repository %s, digest %s (policy configuration %s)\n", x.Namespace, orDash(as.Repository), orDash(as.Digest), x.ConfigHash)
		fmt.Fprintf(out, "  noMatchPolicy of namespace %s (an image no provider applies to): %s\n", x.Namespace, x.NoMatchPolicy)
		for _, p := range x.Providers {
			line := fmt.Sprintf("  %s: applies=%v, %s; %s", p.Provider, p.Applies, p.Why, describeWatchFiles(p.WatchFiles, p.WatchFilesFromArgs))
			if c := p.Cached; c != nil {
				what := "allowed"
				if !c.Allowed {
					what = "refused"
				}
				line += fmt.Sprintf("; cached: %s until %s: %s", what, c.CachedUntil.Format(time.RFC3339), c.Reason)
			}
			fmt.Fprintln(out, line)
		}
		fmt.Fprintf(out, "  verdict: %s\n", x.Verdict)
	}
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
	if err := f.loadConfig(cmd); err != nil {
		return nil, nil, err
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
		core.SetExpiry(f.expiry)
		local.Core = core
	}
	return local, func() {
		for _, c := range closers {
			c()
		}
	}, nil
}

// listImages asks the runtime (--runtime-endpoint) for the node's images.
func (f *recordsFlags) listImages(ctx context.Context) ([]ensure.Image, error) {
	backend, err := criproxy.Dial(f.runtime, "")
	if err != nil {
		return nil, err
	}
	defer backend.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	images, err := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime)).Images(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the images of the runtime at %s: %w", f.runtime, err)
	}
	return images, nil
}

// preloadedLayers asks the runtime for the layers of the images left out
// of present (records.PreloadedLayers).
func (f *recordsFlags) preloadedLayers(ctx context.Context, images, present []records.Image) (map[string][]digest.Digest, error) {
	backend, err := criproxy.Dial(f.runtime, "")
	if err != nil {
		return nil, err
	}
	defer backend.Close()
	rt := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime))
	return records.PreloadedLayers(ctx, rt, images, present)
}

// nodeImages is listImages with the repositories each is listed under.
func (f *recordsFlags) nodeImages(ctx context.Context) ([]records.Image, error) {
	images, err := f.listImages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]records.Image, 0, len(images))
	for _, img := range images {
		out = append(out, records.NodeImage(img.ID, img.Names))
	}
	return out, nil
}

// loadConfig takes the paths and policy from --config, where the flags do
// not say otherwise.
func (f *recordsFlags) loadConfig(cmd *cobra.Command) error {
	if f.configPath == "" {
		return nil
	}
	cfg, err := config.Load(f.configPath)
	if err != nil {
		return err
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
	f.expiry = e.Expiry()
	return nil
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
