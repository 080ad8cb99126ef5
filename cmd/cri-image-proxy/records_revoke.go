package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
)

// records forget, revoke and gc: the commands that take records or
// credentials away.

func (f *recordsFlags) forgetCmd() *cobra.Command {
	return &cobra.Command{Use: "forget IMAGE", Short: "Delete an image's record (with NeverVerifyPreloadedImages a present image then counts as preloaded)", Args: cobra.ExactArgs(1),
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
		})}
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

func (f *recordsFlags) gcCmd() *cobra.Command {
	return &cobra.Command{Use: "gc", Short: "Drop records of images the runtime no longer lists, and stale grants, now", Args: cobra.NoArgs,
		RunE: f.runWrite(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
			r, err := a.GC(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "dropped %d record(s) and %d grant(s)\n", r.Records, r.Grants)
			return nil
		})}
}
