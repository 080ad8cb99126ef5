package imagepolicy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// watchSetup is an engine with a provider "sig" watching a policy file
// and a key directory, a provider "other" watching nothing, and a verdict
// of each cached.
type watchSetup struct {
	*testEngine
	dir, policy, keys string
}

func newWatchSetup(t *testing.T) *watchSetup {
	t.Helper()
	dir := t.TempDir()
	ws := &watchSetup{dir: dir, policy: filepath.Join(dir, "policy.yaml"), keys: filepath.Join(dir, "keys")}
	if err := os.Mkdir(ws.keys, 0o755); err != nil {
		t.Fatal(err)
	}
	ws.write(t, ws.policy, "v1")
	ws.write(t, filepath.Join(ws.keys, "release.pub"), "key 1")
	sig := testProvider("sig", []string{"secure"}, "registry.test")
	sig.WatchFiles = []string{ws.policy, ws.keys}
	ws.testEngine = newTestEngine(t, &Config{Providers: []Provider{sig, testProvider("other", []string{"secure"}, "registry.test")}})
	ws.decide(t)
	return ws
}

func (ws *watchSetup) write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (ws *watchSetup) decide(t *testing.T) Verdict {
	t.Helper()
	v, err := ws.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
	if err != nil || !v.Allowed {
		t.Fatalf("verdict %+v, %v", v, err)
	}
	return v
}

// runs is how often each provider's plugin ran.
func (ws *watchSetup) runs() (sig, other int) {
	return ws.runners["sig"].calls(), ws.runners["other"].calls()
}

func TestAChangeOfAWatchedFileDropsTheProvidersVerdicts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, ws *watchSetup)        // nil: none
		change  func(t *testing.T, ws *watchSetup) string // the event's path
	}{
		{"the policy file rewritten", nil, func(t *testing.T, ws *watchSetup) string {
			ws.write(t, ws.policy, "v2: the key removed")
			return ws.policy
		}},
		{"the policy file replaced by a rename over it", nil, func(t *testing.T, ws *watchSetup) string {
			tmp := filepath.Join(ws.dir, ".policy.yaml.tmp")
			ws.write(t, tmp, "v2")
			if err := os.Rename(tmp, ws.policy); err != nil {
				t.Fatal(err)
			}
			return ws.policy
		}},
		{"a key file of a watched directory removed", nil, func(t *testing.T, ws *watchSetup) string {
			key := filepath.Join(ws.keys, "release.pub")
			if err := os.Remove(key); err != nil {
				t.Fatal(err)
			}
			return key
		}},
		{"a key file added to a watched directory", nil, func(t *testing.T, ws *watchSetup) string {
			key := filepath.Join(ws.keys, "new.pub")
			ws.write(t, key, "key 2")
			return key
		}},
		{"the policy file's symbolic link swapped, as a ConfigMap volume does: the event names another entry", func(t *testing.T, ws *watchSetup) {
			// The policy a link into ..data, as the kubelet lays a ConfigMap
			// out, and the engine has seen that state.
			for _, d := range []string{"..v1", "..v2"} {
				if err := os.Mkdir(filepath.Join(ws.dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			ws.write(t, filepath.Join(ws.dir, "..v1", "policy.yaml"), "v1")
			ws.write(t, filepath.Join(ws.dir, "..v2", "policy.yaml"), "v2, longer")
			if err := os.Symlink("..v1", filepath.Join(ws.dir, "..data")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(ws.policy); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("..data/policy.yaml", ws.policy); err != nil {
				t.Fatal(err)
			}
			ws.FileChanged(ws.policy)
			ws.decide(t)
		}, func(t *testing.T, ws *watchSetup) string {
			if err := os.Symlink("..v2", filepath.Join(ws.dir, "..data_tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(ws.dir, "..data_tmp"), filepath.Join(ws.dir, "..data")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(ws.dir, "..data")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws := newWatchSetup(t)
			if tc.prepare != nil {
				tc.prepare(t, ws)
			}
			sig0, other0 := ws.runs()
			if dropped := ws.FileChanged(tc.change(t, ws)); !slices.Equal(dropped, []string{"sig"}) {
				t.Errorf("FileChanged dropped %v, want [sig]", dropped)
			}
			ws.decide(t)
			if sig, other := ws.runs(); sig != sig0+1 || other != other0 {
				t.Errorf("after the change sig ran %d more times, other %d: want sig asked again, other's verdict kept", sig-sig0, other-other0)
			}
			if got := testutil.ToFloat64(ws.metrics.fileChanges.WithLabelValues("sig")); got < 1 {
				t.Errorf("watched file changes of sig: %v", got)
			}
			if !strings.Contains(ws.log.String(), `msg="image policy: a file of the plugin changed; its cached verdicts are dropped" plugin=sig`) {
				t.Errorf("log:\n%s", ws.log)
			}
		})
	}
}

func TestWhatIsNoChangeOfAWatchedFileKeepsTheVerdicts(t *testing.T) {
	t.Parallel()
	ws := newWatchSetup(t)
	sibling := filepath.Join(ws.dir, "unrelated.txt")
	ws.write(t, sibling, "x")
	for _, path := range []string{sibling, filepath.Join(t.TempDir(), "policy.yaml"), filepath.Join(ws.keys, "sub", "x")} {
		if dropped := ws.FileChanged(path); len(dropped) != 0 {
			t.Errorf("FileChanged(%s) dropped %v", path, dropped)
		}
	}
	ws.decide(t)
	if sig, _ := ws.runs(); sig != 1 {
		t.Errorf("sig ran %d times, want its verdict kept", sig)
	}
}

func TestAVerdictMadeAcrossAChangeIsNeitherCachedNorBound(t *testing.T) {
	t.Parallel()
	ws := newWatchSetup(t)
	ws.write(t, ws.policy, "v2")
	ws.FileChanged(ws.policy)
	f := ws.runners["sig"]
	f.release = make(chan struct{})
	done := make(chan Verdict)
	go func() {
		v, _ := ws.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
		done <- v
	}()
	for f.calls() < 2 { // the plugin is running
		time.Sleep(time.Millisecond)
	}
	ws.write(t, ws.policy, "v3: it read v2")
	ws.FileChanged(ws.policy)
	close(f.release)
	v := <-done
	if !v.Allowed || v.Decisions[0].FromCache || !v.Decisions[0].CachedUntil.IsZero() {
		t.Errorf("verdict %+v: want the plugin's, not cached", v)
	}
	f.release = nil
	ws.Bind(v, imageID)
	if c, _ := ws.Decide(context.Background(), create("secure", "registry.test/app", imageID)); c.Decisions[0].FromCache {
		t.Errorf("a verdict made before the change was bound: %+v", c)
	}
	if sig, _ := ws.runs(); sig != 3 {
		t.Errorf("sig ran %d times, want 3: the pull across the change, and the create", sig)
	}
}

func TestWatchedDirs(t *testing.T) {
	t.Parallel()
	ws := newWatchSetup(t)
	if got, want := ws.WatchedDirs(), []string{ws.dir, ws.keys}; !slices.Equal(got, want) {
		t.Errorf("WatchedDirs() = %v, want %v", got, want)
	}
}
