package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// policyFlags select image policy providers (package imagepolicy) in
// plugins validate and plugins test, in place of credential providers.
type policyFlags struct {
	config, binDir string
	// The subject of plugins test.
	namespace, digest, imageID, call, pod string
	static                                bool
	username                              string
	passwordStdin                         bool
}

func (f *policyFlags) add(cmd *cobra.Command, subject bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.config, "image-policy-config", "", "an ImagePolicyConfig, a file or a directory: work on image policy providers instead of credential providers")
	fl.StringVar(&f.binDir, "image-policy-bin-dir", "", "the directory of the image policy plugin executables")
	if !subject {
		return
	}
	fl.StringVar(&f.namespace, "namespace", "", "the pod's namespace (empty: the configuration's defaultNamespace)")
	fl.StringVar(&f.digest, "digest", "", "the manifest digest the registry resolves IMAGE to (or give IMAGE as repository@digest)")
	fl.StringVar(&f.imageID, "image-id", "", "the image ID, as at CreateContainer")
	fl.StringVar(&f.call, "call", string(imagepolicy.CallPullImage), "PullImage, CreateContainer or ImageVolume")
	fl.StringVar(&f.pod, "pod", "plugins-test", "the pod's name")
	fl.BoolVar(&f.static, "static", false, "the pod is a static pod")
	fl.StringVar(&f.username, "username", "", "a registry username, given with the password to providers with sendCredentials")
	fl.BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password from stdin")
}

func (f *policyFlags) enabled() bool { return f.config != "" || f.binDir != "" }

func (f *policyFlags) load() (*imagepolicy.Config, error) {
	if f.config == "" || f.binDir == "" {
		return nil, errors.New("give both --image-policy-config and --image-policy-bin-dir")
	}
	return imagepolicy.LoadConfig(f.config, f.binDir)
}

// policyValidate is plugins validate for image policy providers.
func policyValidate(out io.Writer, f *policyFlags) error {
	cfg, err := f.load()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PROVIDER\tNAMESPACES\tMATCH IMAGES\tFAILURE POLICY\tTIMEOUT\tCACHE ALLOW/DENY\tCREDENTIALS\tFILE")
	for _, p := range cfg.Providers {
		creds := "not sent"
		if p.SendCredentials {
			creds = "sent"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%v/%v\t%s\t%s\n", p.Name, strings.Join(p.Namespaces, ","), strings.Join(p.MatchImages, ","),
			p.FailurePolicy, p.Timeout, p.AllowCacheDuration, p.DenyCacheDuration, creds, p.File)
	}
	w.Flush()
	for _, p := range cfg.Providers {
		fmt.Fprintf(out, "provider %s: %s\n", p.Name, describeWatchFiles(p.WatchFiles, p.WatchFilesFromArgs))
	}
	if cfg.DefaultNamespace != "" {
		fmt.Fprintf(out, "pulls without a pod are decided for namespace %s\n", cfg.DefaultNamespace)
	}
	fmt.Fprintf(out, "noMatchPolicy (an image no provider applies to): %s\n", describeNoMatch(cfg.NoMatch))
	fmt.Fprintf(out, "valid: %d image policy provider(s), config hash %s\n", len(cfg.Providers), cfg.Hash)
	return nil
}

// describeWatchFiles says which of a plugin's files drop its cached
// verdicts when they change.
func describeWatchFiles(files []string, fromArgs bool) string {
	from := "watchFiles"
	if fromArgs {
		from = "taken from its args"
	}
	if len(files) == 0 {
		return fmt.Sprintf("no file watched (%s): a change of its policy or keys takes effect at a reload or when its verdicts expire", from)
	}
	return fmt.Sprintf("a change of %s drops its cached verdicts (%s)", strings.Join(files, ", "), from)
}

// describeNoMatch lists the namespaces' no-match policies.
func describeNoMatch(r imagepolicy.NoMatchRules) string {
	parts := []string{fmt.Sprintf("%s by default", r.DefaultPolicy())}
	for _, ns := range slices.Sorted(maps.Keys(r.Namespaces)) {
		parts = append(parts, fmt.Sprintf("%s in %s", r.Namespaces[ns], ns))
	}
	return strings.Join(parts, ", ")
}

// policySubject is the subject plugins test asks about.
func (f *policyFlags) subject(image string, stdin io.Reader) (imagepolicy.Subject, error) {
	s := imagepolicy.Subject{Call: imagepolicy.Call(f.call), Image: image, Digest: f.digest, ImageID: f.imageID,
		Pod: imagepolicy.Pod{Namespace: f.namespace, Name: f.pod, Static: f.static}}
	switch {
	case imageref.IsID(image), f.imageID != "" && imageref.MayBeIDPrefix(image):
		// An image ID or a prefix of one: no repository, every provider of
		// the namespace applies.
	default:
		n := imageref.Parse(image)
		if !n.OK {
			return s, fmt.Errorf("%q is not an image reference (give --image-id for an image known by ID only)", image)
		}
		s.Repository = n.Repository
		if _, d, ok := strings.Cut(image, "@"); ok && s.Digest == "" {
			s.Digest = d
		}
	}
	if s.Digest == "" && s.ImageID == "" {
		return s, fmt.Errorf("no digest: give IMAGE as repository@sha256:..., or --digest (the digest the registry resolves %s to), or --image-id", image)
	}
	if f.passwordStdin {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return s, fmt.Errorf("reading the password: %w", err)
		}
		s.Credential = &imagepolicy.Credential{Username: f.username, Password: strings.TrimRight(line, "\r\n")}
	} else if f.username != "" {
		return s, errors.New("--username needs --password-stdin")
	}
	return s, nil
}

// policyTest is plugins test for image policy providers: a fresh engine
// (empty caches), so every provider that applies runs, as at a first
// pull. It fails when the image is refused.
func policyTest(ctx context.Context, out io.Writer, stdin io.Reader, f *policyFlags, image string) error {
	cfg, err := f.load()
	if err != nil {
		return err
	}
	s, err := f.subject(image, stdin)
	if err != nil {
		return err
	}
	e, err := imagepolicy.New(cfg, imagepolicy.Options{})
	if err != nil {
		return err
	}
	x := e.Explain(s)
	repo := s.Repository
	if repo == "" {
		repo = "(none: known by ID only)"
	}
	if x.Repository != "" {
		repo = x.Repository
	}
	fmt.Fprintf(out, "image %s, call %s, namespace %q: the providers get repository %s, digest %s, image ID %s\n",
		image, s.Call, x.Namespace, repo, orNone(s.Digest), orNone(s.ImageID))
	fmt.Fprintf(out, "namespace %q's noMatchPolicy (an image no provider applies to): %s\n\n", x.Namespace, x.NoMatchPolicy)
	for _, p := range x.Providers {
		if !p.Applies {
			fmt.Fprintf(out, "provider %s: does not apply: %s\n", p.Provider, p.Why)
			continue
		}
		creds := "the pull's credential is not sent"
		if p.SendCredentials {
			creds = "the pull's credential is sent"
		}
		fmt.Fprintf(out, "provider %s: applies (%s); failurePolicy %s; %s\n", p.Provider, p.Why, p.FailurePolicy, creds)
	}
	start := time.Now()
	v, err := e.Decide(ctx, s)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nran the providers that apply in %v\n", time.Since(start).Round(time.Millisecond))
	for _, d := range v.Decisions {
		what := "allowed"
		if !d.Allowed {
			what = "refused"
		}
		switch {
		case d.Fault != "":
			fmt.Fprintf(out, "provider %s gave no verdict: %s\n  failurePolicy %s: %s\n", d.Provider, d.Fault, d.FailurePolicy, what)
		default:
			fmt.Fprintf(out, "provider %s %s\n  reason: %s\n", d.Provider, what, strings.ReplaceAll(d.Reason, "\n", "\n  "))
			if !d.CachedUntil.IsZero() {
				fmt.Fprintf(out, "  the daemon would cache it for %v\n", d.CachedUntil.Sub(start).Round(time.Second))
			} else {
				fmt.Fprintln(out, "  the daemon would not cache it")
			}
		}
		if d.PodReason != "" {
			fmt.Fprintf(out, "  the pod would see: %s\n", d.PodReason)
		}
	}
	fmt.Fprintln(out)
	if len(v.Decisions) == 0 {
		fmt.Fprintf(out, "%s\n", v.Reason())
	}
	if !v.Allowed {
		fmt.Fprintf(out, "verdict: REFUSED (%s)\n", v.PodReason)
		return fmt.Errorf("image %s is refused for namespace %q", image, v.Namespace)
	}
	switch {
	case len(v.Decisions) == 0 && v.NoMatchPolicy == imagepolicy.NoMatchWarn:
		fmt.Fprintln(out, "verdict: allowed with a warning: no provider applies (the daemon logs and counts it)")
	case len(v.Decisions) == 0:
		fmt.Fprintln(out, "verdict: allowed: no provider applies")
	default:
		fmt.Fprintln(out, "verdict: allowed")
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
