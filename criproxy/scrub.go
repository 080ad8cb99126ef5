package criproxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// scrubPullSecrets is the outermost hook of every PullImage. The runtime
// may quote the request's credential in its error (containerd 1.6 answers
// an auth that decodes to no "user:password" with `invalid decoded auth:
// "<what it decoded>"`), and the proxy passes errors on: every credential
// field of the request, as sent, decoded and quoted, is cut out of the
// error before it is returned, logged or counted. The code stays.
func scrubPullSecrets(ctx context.Context, req *runtimeapi.PullImageRequest, next Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	resp, err := next(ctx, req)
	if err == nil {
		return resp, nil
	}
	return nil, ScrubError(err, PullSecrets(req.GetAuth())...)
}

// PullSecrets lists the forms a pull's credential may take in a runtime's
// message: each secret field as sent, the auth field decoded, and the
// password within it.
func PullSecrets(a *runtimeapi.AuthConfig) []string {
	if a == nil {
		return nil
	}
	out := []string{a.GetPassword(), a.GetAuth(), a.GetIdentityToken(), a.GetRegistryToken()}
	if dec, err := base64.StdEncoding.DecodeString(a.GetAuth()); err == nil {
		out = append(out, string(dec))
		if _, pass, ok := strings.Cut(string(dec), ":"); ok {
			out = append(out, pass)
		}
	}
	return out
}

// redacted replaces a secret in a message.
const redacted = "<redacted>"

// ScrubError returns err with every non-empty secret, and its %q-quoted
// form, cut out of its message; err itself when none occurs. The error is
// first given its gRPC code as the edge would give it (ToStatus), so a
// scrubbed errdefs or context error keeps its code, and the status's
// details go when a secret occurs in them.
func ScrubError(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	st := status.Convert(ToStatus(err))
	msg := scrub(st.Message(), secrets)
	leakyDetails := len(st.Details()) > 0 && detailsQuote(st, secrets)
	if msg == st.Message() && !leakyDetails {
		return err
	}
	if !leakyDetails {
		p := st.Proto()
		p.Message = msg
		return status.FromProto(p).Err()
	}
	return status.Error(st.Code(), msg)
}

// detailsQuote reports whether a status's details hold a secret, in any
// form scrub would cut, as bytes or in JSON's escapes of <, > and &.
func detailsQuote(st *status.Status, secrets []string) bool {
	for _, d := range st.Proto().GetDetails() {
		b, err := proto.Marshal(d)
		if err != nil {
			return true
		}
		body := string(b)
		if scrub(body, secrets) != body || scrub(body, jsonEscaped(secrets)) != body {
			return true
		}
	}
	return false
}

// jsonEscaped is each secret as encoding/json writes it inside a string.
func jsonEscaped(secrets []string) []string {
	out := make([]string, 0, len(secrets))
	for _, s := range secrets {
		b, err := json.Marshal(s)
		if err != nil || len(b) < 2 {
			continue
		}
		out = append(out, string(b[1:len(b)-1]))
	}
	return out
}

func scrub(msg string, secrets []string) string {
	// Longest first, so that a secret containing another goes whole.
	for _, s := range longestFirst(secrets) {
		if s == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, s, redacted)
		if q := strconv.Quote(s); len(q) > 2 {
			msg = strings.ReplaceAll(msg, q[1:len(q)-1], redacted)
		}
	}
	return msg
}

func longestFirst(ss []string) []string {
	out := append([]string(nil), ss...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
