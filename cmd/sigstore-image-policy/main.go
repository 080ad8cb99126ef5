package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// maxRequest bounds what is read from stdin: a request is a few KiB.
const maxRequest = 1 << 20

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sigstore-image-policy:", err)
		os.Exit(1)
	}
}

// run answers one request: a verdict on stdout, or an error (exit 1) for
// a request it cannot read or a policy it cannot load.
func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("sigstore-image-policy", flag.ContinueOnError)
	policyPath := fs.String("policy", "", "the SigstoreImagePolicy file (required)")
	timeout := fs.Duration("registry-timeout", 20*time.Second, "bound on the registry reads of one request; keep it below the provider's timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *policyPath == "" {
		return errors.New("--policy is required")
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxRequest+1))
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if len(data) > maxRequest {
		return fmt.Errorf("the request is more than %d bytes", maxRequest)
	}
	req, err := policyapi.DecodeRequest(data)
	if err != nil {
		return err
	}
	pol, err := LoadPolicy(*policyPath)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp := pol.Decide(ctx, req)
	out, err := policyapi.EncodeResponse(req.APIVersion, resp)
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(out, '\n'))
	return err
}

// Decide is the verdict for one request.
func (p *Policy) Decide(ctx context.Context, req *policyapi.ImagePolicyRequest) policyapi.ImagePolicyResponse {
	ns, repo := req.Pod.Namespace, req.Repository
	np := p.forImage(ns, repo)
	if np == nil {
		return policyapi.Deny(clip(fmt.Sprintf("no policy of %s covers namespace %q and repository %q", p.File, ns, repo)),
			fmt.Sprintf("no signature policy for this image in namespace %s", ns))
	}
	if repo == "" || req.Digest == "" {
		return policyapi.Deny(clip(fmt.Sprintf("policy %s: the image %s is known by ID only (no repository and manifest digest): its signatures cannot be looked up", np.name, req.Image)),
			"signatures cannot be checked for an image named by ID; use its name")
	}
	reg, err := p.newRegistry(ctx, repo, req.Credential)
	if err != nil {
		return policyapi.Deny(clip(fmt.Sprintf("policy %s: %v", np.name, err)), "signature check failed: bad repository")
	}
	cands, err := reg.find(req.Digest)
	if err != nil {
		// Transient or not, a registry that cannot be read is no
		// signature: refused, and asked again next time.
		resp := policyapi.Deny(clip(fmt.Sprintf("policy %s: cannot read the signatures of %s@%s at its registry: %v", np.name, repo, req.Digest, err)),
			"signature check failed: the registry could not be read")
		resp.CacheDuration = &metav1.Duration{}
		return resp
	}
	if len(cands) == 0 {
		return policyapi.Deny(clip(fmt.Sprintf("policy %s: no signature of %s@%s (cosign tag %s.sig, OCI referrers)", np.name, repo, req.Digest, strings.Replace(req.Digest, ":", "-", 1))),
			"image is not signed")
	}
	var tried []string
	for _, a := range np.authorities {
		var whys []string
		for i := range cands {
			err := a.verifyCandidate(&cands[i], req.Digest)
			if err == nil {
				return policyapi.Allow(clip(fmt.Sprintf("policy %s: %s@%s is signed by authority %s (%s), %s", np.name, repo, req.Digest, a.name, a.describe, cands[i].where)))
			}
			whys = append(whys, fmt.Sprintf("%s: %v", cands[i].where, err))
		}
		tried = append(tried, fmt.Sprintf("authority %s (%s): %s", a.name, a.describe, strings.Join(whys, "; ")))
	}
	return policyapi.Deny(clip(fmt.Sprintf("policy %s: none of the %d signature(s) of %s@%s verifies:\n\t%s", np.name, len(cands), repo, req.Digest, strings.Join(tried, "\n\t"))),
		"no valid signature by a trusted key or identity")
}

// clip keeps an operator's reason within the API's bounds: a registry's
// error text is the registry's to choose, control characters included.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	const max = policyapi.MaxReason - len("…(truncated)")
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…(truncated)"
}
