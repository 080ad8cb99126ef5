package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/spf13/cobra"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/kubeletrecords"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// records export, import and restore: the records moved to and from the
// kubelet's own layout, and a backup of the database installed.

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
preloaded tags from a tenant's): those names need verification under the kubelet. Image IDs are
written as the runtime at --runtime-endpoint writes them (the kubelet keys its files by them; CRI-O's
are bare hex), so the runtime must answer.`,
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
			// The kubelet names a record's file after the runtime's image
			// ref: IDs are written in the runtime's form (CRI-O: bare hex).
			ids, err := f.runtimeIDs(ctx)
			if err != nil {
				return fmt.Errorf("the kubelet keys its records by the runtime's image IDs, in the runtime's form: %w (nothing written)", err)
			}
			kubeletrecords.InRuntimeForm(ex.Records, ex.Preloaded, ids)
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
			printImported(cmd.OutOrStdout(), f.database, rep, res, len(pre))
			return nil
		}}
	cmd.Flags().StringVar(&format, "format", "", "the records' format: kubelet")
	cmd.Flags().BoolVar(&create, "create", false, "create the database when it does not exist")
	return cmd
}

// printImported says what an import of a kubelet's records did, and what
// it could not carry.
func printImported(out io.Writer, database string, rep kubeletrecords.ReadReport, res kubeletrecords.ImportReport, preloaded int) {
	fmt.Fprintf(out, "imported %d record(s) (%d merged with the database's) and %d intent(s) into %s\n", rep.Records, res.Merged, rep.Intents, database)
	if res.Unmapped > 0 {
		fmt.Fprintf(out, "%d record(s) of the kubelet named no repository (pulled, every pod verifies): recorded as pulled with no verified credential for the %d repositories the runtime lists their images under", res.Unmapped, res.Repositories)
		if res.NoRepository > 0 {
			fmt.Fprintf(out, "; %d of them still name none (their image is not on the node, or has no name)", res.NoRepository)
		}
		fmt.Fprintln(out)
	}
	if preloaded > 0 {
		fmt.Fprintf(out, "%d preloaded record(s) of the kubelet gave their images %d preloaded name(s)", preloaded, res.PreloadedNames)
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
			printRestored(cmd.OutOrStdout(), args[0], f.database, rep, names)
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

// printRestored says what a restore did, and what the operator should
// know of it.
func printRestored(out io.Writer, backup, database string, rep records.RestoreReport, names []string) {
	fmt.Fprintf(out, "restored %s into %s\n", backup, database)
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
}
