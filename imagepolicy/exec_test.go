package imagepolicy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// TestExecFaults runs real plugin executables through the engine: each
// fault refuses under Fail with its cause for the operator, and allows
// under Ignore; the engine keeps deciding afterwards.
func TestExecFaults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const v = policyapi.V1alpha1
	testkit.WritePlugin(t, dir, "allow", `cat >/dev/null; echo '{"apiVersion":"`+v+`","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}'`)
	testkit.WritePlugin(t, dir, "echo-request", `req=$(cat); printf '%s' "$req" > "$REQUEST_FILE"; echo "password s3cret-pw seen" >&2
echo '{"apiVersion":"`+v+`","kind":"ImagePolicyResponse","allowed":false,"podReason":"unsigned"}'`)
	testkit.WritePlugin(t, dir, "crash", `cat >/dev/null; kill -SEGV $$`)
	testkit.WritePlugin(t, dir, "exit-2", `cat >/dev/null; echo "cannot read policy" >&2; exit 2`)
	testkit.WritePlugin(t, dir, "hang", `cat >/dev/null; sleep 1000`)
	testkit.WritePlugin(t, dir, "garbage", `cat >/dev/null; echo 'allowed: yes s3cret-pw'`)
	testkit.WritePlugin(t, dir, "other-version", `cat >/dev/null; echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1","kind":"ImagePolicyResponse","allowed":true}'`)
	testkit.WritePlugin(t, dir, "no-verdict", `cat >/dev/null; echo '{"apiVersion":"`+v+`","kind":"ImagePolicyResponse","reason":"thinking"}'`)
	testkit.WritePlugin(t, dir, "huge", `cat >/dev/null; head -c 10485760 /dev/zero`)

	for _, tc := range []struct {
		plugin string
		cause  string // in the operator's reason
	}{
		{"crash", "segmentation fault"},
		{"exit-2", "exit code 2"},
		{"hang", "plugin timed out after 300ms; killed with its process group"},
		{"garbage", "not a JSON object"},
		{"other-version", `apiVersion is "imagepolicy.cri-image-proxy.io/v1", want "` + v + `"`},
		{"no-verdict", "allowed is missing"},
		{"huge", "more than 1048576 bytes on stdout"},
		{"absent", "no such file"},
	} {
		for _, policy := range []FailurePolicy{Fail, Ignore} {
			t.Run("a plugin that "+tc.plugin+" under "+string(policy), func(t *testing.T) {
				t.Parallel()
				p := testProvider(tc.plugin, []string{"secure"}, "registry.test")
				p.Timeout, p.FailurePolicy = 10*time.Second, policy // a loaded machine is slow to start a shell
				if tc.plugin == "hang" {
					p.Timeout = 300 * time.Millisecond
				}
				e, err := New(&Config{BinDir: dir, Hash: "h", Providers: []Provider{p}}, Options{})
				if err != nil {
					t.Fatal(err)
				}
				vd, err := e.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
				if err != nil {
					t.Fatal(err)
				}
				if vd.Allowed != (policy == Ignore) || !strings.Contains(vd.Reason(), tc.cause) {
					t.Errorf("allowed %v, reason %q: want allowed %v and %q", vd.Allowed, vd.Reason(), policy == Ignore, tc.cause)
				}
				if strings.Contains(vd.Reason(), "s3cret-pw") {
					t.Errorf("the reason quotes the plugin's output: %q", vd.Reason())
				}
			})
		}
	}

	t.Run("the plugin gets the request on stdin, and its stderr is logged masked", func(t *testing.T) {
		t.Parallel()
		reqFile := filepath.Join(t.TempDir(), "request.json")
		p := testProvider("echo-request", []string{"secure"}, "registry.test")
		p.SendCredentials, p.Env = true, []EnvVar{{Name: "REQUEST_FILE", Value: reqFile}}
		var log bytes.Buffer
		e, err := New(&Config{BinDir: dir, Hash: "h", Providers: []Provider{p}}, Options{Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		s := pull("secure", "registry.test/app", digestA)
		s.Credential = &Credential{Username: "u", Password: "s3cret-pw"}
		vd, _ := e.Decide(context.Background(), s)
		if vd.Allowed || vd.PodReason != "unsigned" {
			t.Fatalf("verdict %+v", vd)
		}
		b, err := os.ReadFile(reqFile)
		if err != nil {
			t.Fatal(err)
		}
		req, err := policyapi.DecodeRequest(b)
		if err != nil {
			t.Fatalf("the plugin got an invalid request: %v", err)
		}
		if req.Digest != digestA || req.Pod.Namespace != "secure" || req.Credential.Password != "s3cret-pw" {
			t.Errorf("request %+v", req)
		}
		if !strings.Contains(log.String(), "image policy plugin wrote to stderr") || strings.Contains(log.String(), "s3cret-pw") {
			t.Errorf("log:\n%s", log.String())
		}
	})

	t.Run("the engine still decides after faults", func(t *testing.T) {
		t.Parallel()
		e, err := New(&Config{BinDir: dir, Hash: "h", Providers: []Provider{testProvider("allow", []string{"secure"}, "registry.test")}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if vd, _ := e.Decide(context.Background(), pull("secure", "registry.test/app", digestA)); !vd.Allowed {
			t.Errorf("verdict %+v", vd)
		}
	})
}
