package execplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

func TestRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		body       string
		timeout    time.Duration
		wantOut    string
		wantErr    error
		wantInErr  string
		wantStderr string
	}{
		{name: "stdin comes back on stdout, args and env with the config's winning", body: `cat; printf ' %s %s %s' "$1" "$MODE" "$HOST_ONLY"`,
			wantOut: "request --flag from-config host"},
		{name: "a non-zero exit is a failure naming the code, stderr kept", body: `echo 'no route' >&2; exit 3`,
			wantErr: ErrFailed, wantInErr: "plugin p: plugin failed: exit code 3", wantStderr: "no route"},
		{name: "a crash is a failure naming the signal", body: `kill -SEGV $$`, wantErr: ErrFailed, wantInErr: "segmentation fault"},
		{name: "too much output kills the plugin", body: `head -c 3000000 /dev/zero`, wantErr: ErrOutputLimit, wantInErr: "more than 1048576 bytes"},
		{name: "a hang is killed at the timeout", body: `sleep 1000`, timeout: 200 * time.Millisecond, wantErr: ErrTimeout, wantInErr: "killed with its process group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, stderr, err := Run(context.Background(), Command{
				Name: "p", Path: testkit.WritePlugin(t, t.TempDir(), "plugin", tc.body), Args: []string{"--flag"}, Env: []string{"MODE=from-config"},
				Environ: func() []string { return []string{"PATH=" + os.Getenv("PATH"), "MODE=from-host", "HOST_ONLY=host"} },
				Stdin:   []byte("request"), Timeout: tc.timeout,
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q lacks %q", err, tc.wantInErr)
			}
			if string(out) != tc.wantOut {
				t.Errorf("stdout %q, want %q", out, tc.wantOut)
			}
			if !strings.Contains(string(stderr), tc.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr, tc.wantStderr)
			}
		})
	}

	t.Run("the caller's cancellation kills the plugin's children too", func(t *testing.T) {
		t.Parallel()
		pidFile := filepath.Join(t.TempDir(), "child")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, _, err := Run(ctx, Command{Name: "p", Path: testkit.WritePlugin(t, t.TempDir(), "plugin", `sleep 1000 & echo $! > "`+pidFile+`"; wait`)})
			done <- err
		}()
		var child int
		for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the plugin did not start its child")
			}
			b, _ := os.ReadFile(pidFile)
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(child, 0) == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				syscall.Kill(child, syscall.SIGKILL)
				t.Fatalf("child %d outlived the cancellation", child)
			}
		}
	})
}

func TestForLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		known    []string
		want     string
	}{
		{"a known secret is masked", "used hunter2 for r.test", []string{"hunter2"}, "used [redacted] for r.test"},
		{"a bearer value is masked", "header: Bearer abc.def", nil, "header: [redacted]"},
		{"a password pair is masked", `{"password": "p4ss"}`, nil, `{[redacted]"}`},
		{"a JWT is masked", "token eyJhbGciOi.eyJzdWIiOi.sig", nil, "token [redacted]"},
		{"plain diagnostics stay", "  cannot reach registry.test  \n", nil, "cannot reach registry.test"},
		{"a long stderr is cut", strings.Repeat("x", 2000), nil, strings.Repeat("x", MaxLoggedStderr) + "…(truncated)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ForLog([]byte(tc.in), tc.known...); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
