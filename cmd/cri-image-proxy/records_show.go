package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// records list and show: the records as a table, one as JSON, or its
// credentials' ages.

func (f *recordsFlags) listCmd() *cobra.Command {
	return &cobra.Command{Use: "list", Short: "List the records", Args: cobra.NoArgs,
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, _ []string) error {
			ex, err := a.List(ctx)
			if err != nil {
				return err
			}
			printRecords(out, ex)
			return nil
		})}
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
func printAges(out io.Writer, list []decision.CredentialAge, now time.Time) {
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

func printRecords(out io.Writer, ex *admin.Export) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "IMAGE ID\tREPOSITORY\tCREDENTIALS\tSERVICE ACCOUNTS\tNODE-WIDE\tUPDATED")
	sort.Slice(ex.Records, func(i, j int) bool { return ex.Records[i].ImageRef < ex.Records[j].ImageRef })
	for _, r := range ex.Records {
		for _, repo := range slices.Sorted(maps.Keys(r.CredentialMapping)) {
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
