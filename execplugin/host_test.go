package execplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
)

var testKind = Kind{
	Config:             "test config",
	Label:              "provider",
	Calls:              Metric{Name: "test_plugin_calls_total", Help: "Runs."},
	Duration:           Metric{Name: "test_plugin_duration_seconds", Help: "Run time."},
	ConfigInfo:         Metric{Name: "test_config_info", Help: "Hash."},
	CacheEntries:       Metric{Name: "test_cache_entries", Help: "Entries."},
	Stderr:             "test plugin wrote to stderr",
	ErrInvalidResponse: errTestInvalid,
}

// testPlugin is a kind's provider: it embeds *Plugin.
type testPlugin struct {
	*Plugin[string, string, string]
}

type testSet struct {
	hash    string
	plugins []*testPlugin
}

func (s *testSet) ConfigHash() string     { return s.hash }
func (s *testSet) Members() []*testPlugin { return s.plugins }

// fakeRunner answers with its function.
type fakeRunner func(ctx context.Context, req string) (string, []byte, error)

func (f fakeRunner) Run(ctx context.Context, req string) (string, []byte, error) { return f(ctx, req) }

type testHost struct {
	*Host[*testSet, *testPlugin]
	reg   *prometheus.Registry
	clock *testclock.FakeClock
	log   *bytes.Buffer
}

func newTestHost(t *testing.T, kind Kind, cacheSize int) *testHost {
	t.Helper()
	th := &testHost{reg: prometheus.NewRegistry(), clock: testclock.NewFakeClock(time.Unix(1_800_000_000, 0)), log: &bytes.Buffer{}}
	var err error
	th.Host, err = NewHost[*testSet, *testPlugin](kind, Options{CacheSize: cacheSize, Clock: th.clock, Registerer: th.reg,
		Logger: slog.New(slog.NewTextHandler(th.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// set makes a set of the providers named, each answering with r.
func (th *testHost) set(hash string, r Runner[string, string], hooks Hooks[string, string], names ...string) *testSet {
	s := &testSet{hash: hash}
	for _, n := range names {
		s.plugins = append(s.plugins, &testPlugin{NewPlugin[string](th.Runtime, n, r, hooks)})
	}
	return s
}

var answer = fakeRunner(func(_ context.Context, req string) (string, []byte, error) { return "ok " + req, nil, nil })

func TestHostInstall(t *testing.T) {
	t.Parallel()
	th := newTestHost(t, testKind, 0)
	if th.Current() != nil {
		t.Fatal("a set before any was installed")
	}
	one := th.set("sha256:one", answer, Hooks[string, string]{}, "a", "b")
	th.Install(one)
	loaded := th.Current()
	_ = one.plugins[0].Cache.Put(authcache.Image, "registry.test/app", "", "x", time.Minute)
	if err := testutil.GatherAndCompare(th.reg, strings.NewReader(`
# HELP test_cache_entries Entries.
# TYPE test_cache_entries gauge
test_cache_entries{provider="a"} 1
test_cache_entries{provider="b"} 0
# HELP test_config_info Hash.
# TYPE test_config_info gauge
test_config_info{hash="sha256:one"} 1
`), "test_config_info", "test_cache_entries"); err != nil {
		t.Error(err)
	}

	th.Install(th.set("sha256:two", answer, Hooks[string, string]{}, "c"))
	if loaded != one || th.Current() == one || th.Current().Members()[0].Name != "c" {
		t.Errorf("a caller that loaded the old set keeps it, the next one gets the new: %v, %v", loaded, th.Current())
	}
	if err := testutil.GatherAndCompare(th.reg, strings.NewReader(`
# HELP test_cache_entries Entries.
# TYPE test_cache_entries gauge
test_cache_entries{provider="c"} 0
# HELP test_config_info Hash.
# TYPE test_config_info gauge
test_config_info{hash="sha256:two"} 1
`), "test_config_info", "test_cache_entries"); err != nil {
		t.Errorf("the metrics show the installed set alone: %v", err)
	}
}

func TestPluginCall(t *testing.T) {
	t.Parallel()
	fail := func(err error) Runner[string, string] {
		return fakeRunner(func(context.Context, string) (string, []byte, error) { return "", []byte("diagnostics"), err })
	}
	for _, tc := range []struct {
		name    string
		runner  Runner[string, string]
		check   func(req, resp string) error
		want    string
		wantErr error
		result  string
	}{
		{name: "an answer is a success", runner: answer, want: "ok req", result: "success"},
		{name: "a run that failed is a failure", runner: fail(fmt.Errorf("plugin p: %w: exit code 3", ErrFailed)), wantErr: ErrFailed, result: "failed"},
		{name: "a run killed at its timeout is a timeout", runner: fail(fmt.Errorf("plugin p: %w", ErrTimeout)), wantErr: ErrTimeout, result: "timeout"},
		{name: "a run killed for its output is output_too_large", runner: fail(fmt.Errorf("plugin p: %w", ErrOutputLimit)), wantErr: ErrOutputLimit, result: "output_too_large"},
		{name: "an answer the codec refuses is an invalid response", runner: fail(fmt.Errorf("plugin p: %w: garbage", errTestInvalid)), wantErr: errTestInvalid, result: "invalid_response"},
		{name: "an answer the kind's check refuses is an invalid response, and the call's error", runner: answer,
			check: func(req, resp string) error { return fmt.Errorf("%w: %s to %s", errTestInvalid, resp, req) }, wantErr: errTestInvalid, result: "invalid_response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			th := newTestHost(t, testKind, 0)
			th.Install(th.set("h", tc.runner, Hooks[string, string]{Check: tc.check}, "p"))
			got, err := th.Current().Members()[0].Call(context.Background(), "req")
			if got != tc.want || !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Errorf("got %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
			if err := testutil.GatherAndCompare(th.reg, strings.NewReader(`
# HELP test_plugin_calls_total Runs.
# TYPE test_plugin_calls_total counter
test_plugin_calls_total{provider="p",result="`+tc.result+`"} 1
`), "test_plugin_calls_total"); err != nil {
				t.Error(err)
			}
			if n := testutil.CollectAndCount(th.reg, "test_plugin_duration_seconds"); n != 1 {
				t.Errorf("%d duration series, want 1", n)
			}
		})
	}
}

func TestPluginCallLogsStderr(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	chatty := fakeRunner(func(_ context.Context, req string) (string, []byte, error) {
		return "answer-pw", []byte("sent " + req + ", got answer-pw; Authorization: Bearer abc.def\n"), nil
	})
	hooks := Hooks[string, string]{
		Image:   func(req string) string { return "registry.test/app" },
		Secrets: func(req, resp string) []string { return []string{req, resp} },
	}
	th := newTestHost(t, testKind, 0)
	th.Install(th.set("h", chatty, hooks, "p"))
	if _, err := th.Current().Members()[0].Call(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	log := th.log.String()
	if !strings.Contains(log, `level=DEBUG msg="test plugin wrote to stderr" plugin=p image=registry.test/app stderr="sent [redacted], got [redacted]; [redacted]"`) {
		t.Errorf("log:\n%s", log)
	}
	for _, secret := range []string{token, "answer-pw", "abc.def"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log shows %q:\n%s", secret, log)
		}
	}

	quiet := &testHost{reg: prometheus.NewRegistry(), log: &bytes.Buffer{}}
	var err error
	quiet.Host, err = NewHost[*testSet, *testPlugin](testKind, Options{Logger: slog.New(slog.NewTextHandler(quiet.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	quiet.Install(quiet.set("h", chatty, hooks, "p"))
	if _, err := quiet.Current().Members()[0].Call(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	if quiet.log.Len() != 0 {
		t.Errorf("stderr is logged above debug level:\n%s", quiet.log)
	}
}

func TestHostRunPurges(t *testing.T) {
	t.Parallel()
	th := newTestHost(t, testKind, 0)
	th.Install(th.set("h", answer, Hooks[string, string]{}, "p"))
	c := th.Current().Members()[0].Cache
	_ = c.Put(authcache.Image, "registry.test/old", "", "x", time.Minute)
	_ = c.Put(authcache.Image, "registry.test/new", "", "x", time.Hour)
	th.clock.Step(2 * time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { th.Run(ctx, time.Millisecond); close(done) }()
	for deadline := time.Now().Add(10 * time.Second); c.Len() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d entries, want the live one alone", c.Len())
		}
	}
	cancel()
	<-done
	if _, _, ok := c.Get("registry.test/new", ""); !ok {
		t.Error("the live entry was purged")
	}
}

func TestOptionalCacheMetrics(t *testing.T) {
	t.Parallel()
	t.Run("a kind that names them counts lookups and evictions", func(t *testing.T) {
		t.Parallel()
		k := testKind
		k.CacheLookups = Metric{Name: "test_cache_lookups_total", Help: "Lookups."}
		k.CacheEvictions = Metric{Name: "test_cache_evictions_total", Help: "Evictions."}
		th := newTestHost(t, k, 1)
		th.Install(th.set("h", answer, Hooks[string, string]{}, "p"))
		p := th.Current().Members()[0]
		p.CountLookup(true)
		p.CountLookup(false)
		p.CountLookup(false)
		_ = p.Cache.Put(authcache.Image, "registry.test/a", "", "x", time.Hour)
		_ = p.Cache.Put(authcache.Image, "registry.test/b", "", "x", time.Hour) // the cache holds one
		if err := testutil.GatherAndCompare(th.reg, strings.NewReader(`
# HELP test_cache_evictions_total Evictions.
# TYPE test_cache_evictions_total counter
test_cache_evictions_total{provider="p"} 1
# HELP test_cache_lookups_total Lookups.
# TYPE test_cache_lookups_total counter
test_cache_lookups_total{provider="p",result="hit"} 1
test_cache_lookups_total{provider="p",result="miss"} 2
`), "test_cache_lookups_total", "test_cache_evictions_total"); err != nil {
			t.Error(err)
		}
	})
	t.Run("a kind that does not name them exports none", func(t *testing.T) {
		t.Parallel()
		th := newTestHost(t, testKind, 1)
		th.Install(th.set("h", answer, Hooks[string, string]{}, "p"))
		p := th.Current().Members()[0]
		p.CountLookup(true)
		_ = p.Cache.Put(authcache.Image, "registry.test/a", "", "x", time.Hour)
		_ = p.Cache.Put(authcache.Image, "registry.test/b", "", "x", time.Hour)
		mfs, err := th.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if n := mf.GetName(); n != "test_config_info" && n != "test_cache_entries" {
				t.Errorf("exported %s", n)
			}
		}
	})
}
