package execplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// testCodec speaks a line protocol: the request is "apiVersion request",
// the answer "apiVersion answer"; an answer in another version is refused.
var testCodec = Codec[string, string]{
	Encode: func(apiVersion, req string) ([]byte, error) {
		if req == "unencodable" {
			return nil, errors.New("cannot encode")
		}
		return []byte(apiVersion + " " + req), nil
	},
	Decode: func(apiVersion string, stdout []byte) (string, error) {
		v, answer, _ := strings.Cut(strings.TrimSpace(string(stdout)), " ")
		if v != apiVersion {
			return "", fmt.Errorf("%w: apiVersion is %q, want %q (the request's)", errTestInvalid, v, apiVersion)
		}
		return answer, nil
	},
}

var errTestInvalid = errors.New("invalid test response")

func TestExec(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	for name, body := range map[string]string{
		// Answers in the request's version: the request, its args and env.
		"echo": `read v req; printf '%s %s|%s|%s|%s' "$v" "$req" "$*" "$MODE" "$HOST_ONLY"`,
		// Answers in another version than the request's.
		"other-version": `cat >/dev/null; echo 'test.io/v2 yes'`,
		"hang":          `cat >/dev/null; sleep 1000`,
	} {
		testkit.WritePlugin(t, bin, name, body+"\n")
	}
	run := func(name, req string, timeout time.Duration) (string, error) {
		x := NewExec(Entry{Name: name, APIVersion: "test.io/v1", Args: []string{"--flag", "x"}, Env: []EnvVar{{Name: "MODE", Value: "from-config"}}}, bin, timeout, testCodec)
		x.Environ = func() []string { return []string{"PATH=" + os.Getenv("PATH"), "MODE=from-host", "HOST_ONLY=host"} }
		answer, _, err := x.Run(context.Background(), req)
		return answer, err
	}
	for _, tc := range []struct {
		name, plugin, req string
		timeout           time.Duration
		want              string
		wantErr           error
		wantInErr         string
	}{
		{name: "the request goes in the provider's apiVersion with its args and env, the config's env winning", plugin: "echo", req: "hello",
			want: "hello|--flag x|from-config|host"},
		{name: "an answer in another apiVersion than the request's is refused, naming the plugin", plugin: "other-version", req: "hello",
			wantErr: errTestInvalid, wantInErr: `plugin other-version: invalid test response: apiVersion is "test.io/v2", want "test.io/v1"`},
		{name: "a request that cannot be encoded runs nothing", plugin: "absent", req: "unencodable",
			wantInErr: "plugin absent: encode request: cannot encode"},
		{name: "the entry's timeout bounds the run", plugin: "hang", req: "hello", timeout: 200 * time.Millisecond,
			wantErr: ErrTimeout, wantInErr: "plugin hang: plugin timed out after 200ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := run(tc.plugin, tc.req, tc.timeout)
			if tc.wantInErr == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Errorf("got %q, %v; want an error with %q", got, err, tc.wantInErr)
			}
		})
	}
}
