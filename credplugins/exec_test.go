package credplugins

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// respond is a script answering a fixed response in the request's apiVersion.
func respond(body string) string {
	return `req=$(cat)
v=$(printf '%s' "$req" | sed -n 's/.*"apiVersion":"\([^"]*\)".*/\1/p')
printf '{"apiVersion":"%s","kind":"CredentialProviderResponse",` + body + `}' "$v"
`
}

const okBody = `"cacheKeyType":"Registry","auth":{"registry.test":{"username":"u","password":"s3cret-pw"}}`

func TestExecPlugin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	testkit.WritePlugin(t, dir, "ok", respond(okBody))
	testkit.WritePlugin(t, dir, "echo-request", `req=$(cat)
v=$(printf '%s' "$req" | sed -n 's/.*"apiVersion":"\([^"]*\)".*/\1/p')
img=$(printf '%s' "$req" | sed -n 's/.*"image":"\([^"]*\)".*/\1/p')
printf '{"apiVersion":"%s","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"%s":{"username":"%s|%s|%s|%s","password":"p"}}}' "$v" "$img" "$v" "$*" "$MODE" "$HOST_ONLY"
`)
	testkit.WritePlugin(t, dir, "garbage", `cat >/dev/null; echo 'this is not json s3cret-pw'`)
	testkit.WritePlugin(t, dir, "wrong-version", `cat >/dev/null; echo '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","kind":"CredentialProviderResponse","cacheKeyType":"Image"}'`)
	testkit.WritePlugin(t, dir, "wrong-kind", `req=$(cat)
v=$(printf '%s' "$req" | sed -n 's/.*"apiVersion":"\([^"]*\)".*/\1/p')
printf '{"apiVersion":"%s","kind":"CredentialProviderRequest","image":"x"}' "$v"`)
	testkit.WritePlugin(t, dir, "bad-key-type", respond(`"cacheKeyType":"Repository","auth":{}`))
	testkit.WritePlugin(t, dir, "unknown-field", respond(`"cacheKeyType":"Image","auth":{"r.test":{"username":"u","password":"s3cret-pw","token":"s3cret-pw"}}`))
	testkit.WritePlugin(t, dir, "negative-duration", respond(`"cacheKeyType":"Image","cacheDuration":"-1m"`))
	testkit.WritePlugin(t, dir, "exit-3", `cat >/dev/null; echo "cannot reach the metadata server" >&2; exit 3`)
	testkit.WritePlugin(t, dir, "crash", `cat >/dev/null; kill -SEGV $$`)
	testkit.WritePlugin(t, dir, "huge", `cat >/dev/null; head -c 104857600 /dev/zero`)
	testkit.WritePlugin(t, dir, "hang", `cat >/dev/null; sleep 1000 & echo $! > "$CHILD_PID_FILE"; sleep 1000`)

	run := func(name, apiVersion string, timeout time.Duration, env []EnvVar, args ...string) (string, error) {
		p := newExecPlugin(Provider{Name: name, APIVersion: apiVersion, Args: args, Env: env}, dir, timeout)
		p.Environ = func() []string { return []string{"PATH=" + os.Getenv("PATH"), "MODE=from-host", "HOST_ONLY=host"} }
		resp, stderr, err := p.Run(context.Background(), execRequest{Image: "registry.test/team/app"})
		if err != nil {
			return string(stderr), err
		}
		return fmt.Sprint(resp.CacheKeyType, " ", resp.Auth), nil
	}

	for _, v := range []string{"v1", "v1beta1", "v1alpha1"} {
		t.Run("a "+v+" plugin gets the request in "+v+", with its args and env, the config's env winning", func(t *testing.T) {
			apiVersion := "credentialprovider.kubelet.k8s.io/" + v
			got, err := run("echo-request", apiVersion, 0, []EnvVar{{Name: "MODE", Value: "from-config"}}, "--flag", "x")
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("Image map[registry.test/team/app:{%s|--flag x|from-config|host p}]", apiVersion)
			if got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}

	for _, tc := range []struct {
		name    string
		plugin  string
		timeout time.Duration
		wantErr error
		want    []string // in the error
	}{
		{"garbage on stdout is an invalid response, not quoted", "garbage", 0, ErrInvalidResponse, []string{"plugin garbage", "not a JSON object"}},
		{"an apiVersion other than the request's is refused", "wrong-version", 0, ErrInvalidResponse, []string{`apiVersion is "credentialprovider.kubelet.k8s.io/v1alpha1", want "credentialprovider.kubelet.k8s.io/v1"`}},
		{"a kind other than CredentialProviderResponse is refused", "wrong-kind", 0, ErrInvalidResponse, []string{`kind is "CredentialProviderRequest"`}},
		{"a cacheKeyType other than Image, Registry, Global is refused", "bad-key-type", 0, ErrInvalidResponse, []string{`cacheKeyType is "Repository"`}},
		{"an unknown field is refused, strictly, without quoting it", "unknown-field", 0, ErrInvalidResponse, []string{"does not decode strictly"}},
		{"a negative cacheDuration is refused", "negative-duration", 0, ErrInvalidResponse, []string{"negative"}},
		{"a non-zero exit names the plugin and the code", "exit-3", 0, ErrPluginFailed, []string{"plugin exit-3", "exit code 3"}},
		{"a crash names the signal", "crash", 0, ErrPluginFailed, []string{"plugin crash", "segmentation fault"}},
		{"100 MB of output is cut and the plugin killed", "huge", 0, ErrPluginOutputLimit, []string{"plugin huge", "more than 1048576 bytes"}},
		{"a missing executable is an error naming it", "absent", 0, ErrPluginFailed, []string{"plugin absent", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(tc.plugin, "credentialprovider.kubelet.k8s.io/v1", tc.timeout, nil)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "s3cret-pw") {
				t.Errorf("the error quotes a credential: %v", err)
			}
		})
	}

	t.Run("stderr comes back for the log", func(t *testing.T) {
		stderr, err := run("exit-3", "credentialprovider.kubelet.k8s.io/v1", 0, nil)
		if err == nil || !strings.Contains(stderr, "cannot reach the metadata server") {
			t.Errorf("stderr %q, err %v", stderr, err)
		}
	})

	t.Run("a hanging plugin is killed at the timeout, with the children it started", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "child.pid")
		_, err := run("hang", "credentialprovider.kubelet.k8s.io/v1", 300*time.Millisecond, []EnvVar{{Name: "CHILD_PID_FILE", Value: pidFile}})
		if !errors.Is(err, ErrPluginTimeout) || !strings.Contains(err.Error(), "plugin hang") {
			t.Fatalf("got %v, want a timeout naming the plugin", err)
		}
		b, rerr := os.ReadFile(pidFile)
		if rerr != nil {
			t.Fatalf("the plugin did not start its child: %v", rerr)
		}
		child, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(child, 0) == nil {
			if time.Now().After(deadline) {
				syscall.Kill(child, syscall.SIGKILL)
				t.Fatalf("the plugin's child %d outlived the timeout", child)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
