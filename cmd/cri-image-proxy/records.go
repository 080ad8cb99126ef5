package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
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
	expiry      *decision.Expiry // from --config: the records' maximum age
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

	// Each subcommand is in the file of its role: records_show.go (list,
	// show), records_explain.go, records_revoke.go (forget, revoke, gc) and
	// records_move.go (export, import, restore); this file finds the
	// records for them.
	cmd.AddCommand(
		f.listCmd(),
		f.showCmd(),
		f.explainCmd(),
		f.forgetCmd(),
		f.revokeCmd(),
		f.gcCmd(),
		f.exportCmd(),
		f.importCmd(),
		f.restoreCmd(),
	)
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
		policy, err := decision.NewPolicy(decision.PolicyName(f.policy), nil)
		if err != nil {
			return nil, nil, err
		}
		core, err := ensure.NewDecider(store, policy, ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime)),
			ensure.DeciderOptions{Expiry: f.expiry})
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

// listImages asks the runtime (--runtime-endpoint) for the node's images.
func (f *recordsFlags) listImages(ctx context.Context) ([]ensure.Image, error) {
	images, _, err := f.listImagesIDs(ctx)
	return images, err
}

// runtimeIDs is how the runtime (--runtime-endpoint) writes an image ID,
// learnt from its list of images: the kubelet keys its record files by
// the runtime's image ref (CRI-O's is bare hex).
func (f *recordsFlags) runtimeIDs(ctx context.Context) (func(string) string, error) {
	_, ids, err := f.listImagesIDs(ctx)
	return ids, err
}

// listImagesIDs lists the runtime's images, and returns with them the
// runtime's way of writing an image ID, learnt from that list.
func (f *recordsFlags) listImagesIDs(ctx context.Context) ([]ensure.Image, func(string) string, error) {
	backend, err := criproxy.Dial(f.runtime, "")
	if err != nil {
		return nil, nil, err
	}
	defer backend.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rt := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime))
	images, err := rt.Images(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the images of the runtime at %s: %w", f.runtime, err)
	}
	return images, rt.RuntimeID, nil
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
