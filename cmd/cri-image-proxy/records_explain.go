package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// records explain: what the proxy decides for an image and a pod, and
// why.

func (f *recordsFlags) explainCmd() *cobra.Command {
	var podUID, namespace string
	var asJSON bool
	cmd := &cobra.Command{Use: "explain IMAGE", Short: "Say what the proxy decides for an image and a pod, and why", Args: cobra.ExactArgs(1),
		RunE: f.run(func(ctx context.Context, a admin.Service, out io.Writer, args []string) error {
			e, err := a.Explain(ctx, args[0], podUID)
			if err != nil {
				return err
			}
			var pe *decision.PolicyExplanation
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
			printVerifications(out, e.Verifications)
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
func printPolicyExplanation(out io.Writer, pe *decision.PolicyExplanation) {
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

// printVerifications lists what the registry (or a mirror vouched for)
// checked for each repository of the image.
func printVerifications(out io.Writer, verifications []decision.Verification) {
	for _, v := range verifications {
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
			fmt.Fprintf(out, "             and %d more (manifests, or past %d)\n", more, decision.MaxListedBlobs)
		}
		for _, l := range v.ProvenLayers {
			fmt.Fprintf(out, "             layer proven by its bytes: %s\n", l)
		}
		if len(v.ProvenLayers) > 0 {
			fmt.Fprintf(out, "             (%d bytes fetched to prove them: the node shared them from another image)\n", v.ProvenBytes)
		}
	}
}
