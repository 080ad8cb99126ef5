package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// ensureEnv is what the ensure scenarios need: two proxies enforcing
// KEP-2535, one with a database of 100 records and one of 100,000, each
// holding a public image pulled anonymously (shown to every pod) and a
// private one pulled with credentials (hidden from pods without them).
type ensureEnv struct {
	small, large       *grpc.ClientConn
	smallPid, largePid int
	largeAdmin         string // the 100,000-record daemon's admin socket
	public, private    string
	// privateLarge is the private image under a tag the 100,000-record
	// daemon alone pulled. Both daemons share one containerd: to the
	// second, the names the first pulled the image under were on the node
	// before its own pull, hence preloaded and shown (as a kubelet's
	// preloaded names are), so each hides only a name it pulled itself.
	privateLarge string
	// remote is the private image through a relay that puts the registry
	// 2 ms (round trip) away, as a registry in the same data center.
	remote string
	// preloaded is the private image's digest under another tag of its
	// repository, on the node before the ensure proxies pulled the private
	// one: a preloaded name of it, shown to every pod.
	preloaded string
	relay     *rig.DelayRelay
}

// fillDatabase writes n records of images that are not on the node.
func fillDatabase(path string, n int) error {
	s, err := records.Open(path, records.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	now := metav1.Now()
	for start := 0; start < n; start += 10000 {
		var recs []*ensure.Record
		for i := start; i < min(n, start+10000); i++ {
			recs = append(recs, &ensure.Record{
				ImageRef:        fmt.Sprintf("sha256:%064x", i+1),
				LastUpdatedTime: now,
				CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{
					fmt.Sprintf("registry.bench/team-%d/app", i%500): {KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{{CredentialHash: fmt.Sprintf("sha256:%064x", i)}}},
				},
			})
		}
		if err := s.PutRecords(recs); err != nil {
			return err
		}
	}
	return nil
}

func (e *benchEnv) setUpEnsure() error {
	// The private image is one of its own, not on the node before the
	// ensure proxies pull it with credentials: an image the node had
	// already (the bench's present image, pulled around the proxies) keeps
	// the names it had as preloaded names, free to every pod, and would not
	// be hidden.
	const privatePath, privateLargePath, preloadedPath = "team-a/ensure:v1", "team-a/ensure:large", "team-a/ensure:node"
	for _, path := range []string{privatePath, privateLargePath, preloadedPath} {
		if _, err := e.rig.PushBusybox(path, "bench: the ensure proxies' private image"); err != nil {
			return err
		}
	}
	ee := &ensureEnv{public: e.rig.AnonRegistry + "/" + rig.TeamBImage, private: e.rig.Registry + "/" + privatePath,
		privateLarge: e.rig.Registry + "/" + privateLargePath, preloaded: e.rig.Registry + "/" + preloadedPath}
	ctx := context.Background()
	if res := e.rig.Crictl(ctx, "unix://"+e.rig.RuntimeSock, "pull", "--creds", "user:"+rig.Users["user"], ee.preloaded); res.Err != nil {
		return fmt.Errorf("pull %s: %v: %s", ee.preloaded, res.Err, res.Stderr)
	}
	var err error
	if ee.relay, err = rig.StartDelayRelay(e.rig.Registry, time.Millisecond); err != nil {
		return err
	}
	if err := e.rig.AddMirror("registry.remote.test", ee.relay.Port()); err != nil {
		return err
	}
	ee.remote = "registry.remote.test/" + privatePath
	for _, v := range []struct {
		name    string
		records int
		conn    **grpc.ClientConn
		pid     *int
		private []string // pulled with credentials: hidden from pods without them
	}{{"ensure-100", 97, &ee.small, &ee.smallPid, []string{ee.private, ee.remote}}, {"ensure-100k", 99998, &ee.large, &ee.largePid, []string{ee.privateLarge}}} {
		dir := filepath.Join(e.rig.Dir, v.name)
		db := filepath.Join(dir, "ensure.db")
		e.logf("filling %s with %d records", v.name, v.records)
		if err := fillDatabase(db, v.records); err != nil {
			return err
		}
		sock := filepath.Join(e.rig.Dir, v.name+".sock")
		p, err := e.rig.StartProxy(e.opts.proxy, sock, append([]string{"--log-level", "info",
			"--ensure-secret-pulled-images", "--ensure-database", db, "--admin-socket", filepath.Join(dir, "admin.sock")},
			e.profiled("proxy-"+v.name)...)...)
		if v.records > 1000 {
			ee.largeAdmin = filepath.Join(dir, "admin.sock")
		}
		if err != nil {
			return err
		}
		e.extraProxies = append(e.extraProxies, p)
		*v.pid = p.Pid()
		if *v.conn, err = rig.DialCRI("unix://" + sock); err != nil {
			return err
		}
		// The images that make the 100th (100,000th) records.
		c := runtimeapi.NewImageServiceClient(*v.conn)
		if _, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ee.public}}); err != nil {
			return fmt.Errorf("%s: pull %s: %w", v.name, ee.public, err)
		}
		for _, img := range v.private {
			if _, err := c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img},
				Auth: aliceAuth}); err != nil {
				return fmt.Errorf("%s: pull %s: %w", v.name, img, err)
			}
		}
	}
	e.ensure = ee
	e.pids["proxy-ensure-100"] = ee.smallPid
	e.pids["proxy-ensure-100k"] = ee.largePid
	return nil
}

// reuseCall is the kubelet's sequence for a pod whose credential is
// already verified: ImageStatus (the image is hidden), then PullImage,
// answered from the node. Only the PullImage is timed.
func reuseCall(cc *grpc.ClientConn, image string, auth *runtimeapi.AuthConfig) call {
	c := runtimeapi.NewImageServiceClient(cc)
	st := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	pull := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth,
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "bench", Namespace: "bench", Uid: "bench-uid"}}}
	return timed(func(ctx context.Context) (time.Duration, error) {
		r, err := c.ImageStatus(ctx, st)
		if err != nil {
			return 0, err
		}
		if r.Image != nil {
			return 0, fmt.Errorf("%s is not hidden", image)
		}
		start := time.Now()
		_, err = c.PullImage(ctx, pull)
		return time.Since(start), err
	})
}

// hiddenCall is an ImageStatus that must find the image hidden.
func hiddenCall(cc *grpc.ClientConn, image string) call {
	c := runtimeapi.NewImageServiceClient(cc)
	req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	return func(ctx context.Context) error {
		r, err := c.ImageStatus(ctx, req)
		if err == nil && r.Image != nil {
			err = fmt.Errorf("%s is shown", image)
		}
		return err
	}
}

// ensureScenarios measure the ensure checks: ImageStatus with a record to
// read or not, at 100 and 100,000 records, and a verified re-use answered
// from the node against the registry's re-check.
func ensureScenarios() []measurement {
	needs := []part{ensureProxies}
	var out []measurement
	for _, conc := range []int{1, 64} {
		out = append(out, scenarioOf(fmt.Sprintf("ensure: ImageStatus c=%d, image shown", conc), needs, func(e *benchEnv) scenario {
			ee := e.ensure
			sc := scenario{
				conc: conc,
				arms: []arm{
					{name: "pass-through proxy", call: imageStatusCall(e.proxied, ee.public), cpu: []string{"proxy"}},
					{name: "ensure proxy (100 records)", call: imageStatusCall(ee.small, ee.public), cpu: []string{"proxy-ensure-100"}},
					{name: "direct", call: imageStatusCall(e.direct, ee.public), cpu: []string{"containerd"}},
				},
			}
			if conc == 1 {
				sc.targets = []target{{desc: "ImageStatus with the ensure check p50 <= 1.05x pass-through", value: p50Ratio(1), max: 1.05}}
			}
			return sc
		}))
	}
	return append(out,
		scenarioOf("ensure: ImageStatus c=1, image hidden", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "pass-through proxy", call: imageStatusCall(e.proxied, ee.private), cpu: []string{"proxy"}},
					{name: "ensure proxy (hides it)", call: hiddenCall(ee.small, ee.private), cpu: []string{"proxy-ensure-100"}},
				},
			}
		}),
		scenarioOf("ensure: ImageStatus c=1, a preloaded tag of a repository pulled with credentials (decided, shown)", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "pass-through proxy", call: imageStatusCall(e.proxied, ee.preloaded), cpu: []string{"proxy"}},
					{name: "ensure proxy (shows it: a preloaded name)", call: imageStatusCall(ee.small, ee.preloaded), cpu: []string{"proxy-ensure-100"}},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("decided, unlike the public image's (its repository is restricted): the response is decoded and re-encoded, where a hidden one is replaced by an empty one; p50 %+d µs over pass-through", r.p50Delta(1).Microseconds())
				},
			}
		}),
		scenarioOf("ensure: ImageStatus c=1, 100 vs 100,000 records, image shown", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "ensure, 100 records", call: imageStatusCall(ee.small, ee.public), cpu: []string{"proxy-ensure-100"}},
					{name: "ensure, 100,000 records", call: imageStatusCall(ee.large, ee.public), cpu: []string{"proxy-ensure-100k"}},
				},
				targets: []target{{desc: "ImageStatus p50 at 100,000 records <= 1.2x at 100", value: p50Ratio(1), max: 1.2}},
			}
		}),
		scenarioOf("ensure: ImageStatus c=1, 100 vs 100,000 records, image hidden (reads the record)", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "ensure, 100 records", call: hiddenCall(ee.small, ee.private), cpu: []string{"proxy-ensure-100"}},
					{name: "ensure, 100,000 records", call: hiddenCall(ee.large, ee.privateLarge), cpu: []string{"proxy-ensure-100k"}},
				},
				targets: []target{{desc: "ImageStatus p50 at 100,000 records <= 1.2x at 100", value: p50Ratio(1), max: 1.2}},
			}
		}),
		scenarioOf("ensure: verified re-use c=1, PullImage re-checked at the registry vs answered from the node", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage, credentials re-checked", call: pullCall(e.direct, ee.private, aliceAuth), cpu: []string{"containerd"}},
					{name: "ensure: PullImage answered from the node (after its ImageStatus, untimed)", call: reuseCall(ee.small, ee.private, aliceAuth), cpu: []string{"proxy-ensure-100"}},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("on a loopback registry: the answer from the node is %.0fx faster (p50) than the registry re-check", 1/r.p50Ratio(1))
				},
			}
		}),
		scenarioOf("ensure: verified re-use c=1, registry 2 ms away, re-checked vs answered from the node", needs, func(e *benchEnv) scenario {
			ee := e.ensure
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct PullImage, credentials re-checked", call: pullCall(e.direct, ee.remote, aliceAuth), cpu: []string{"containerd"}},
					{name: "ensure: PullImage answered from the node (after its ImageStatus, untimed)", call: reuseCall(ee.small, ee.remote, aliceAuth), cpu: []string{"proxy-ensure-100"}},
				},
				targets: []target{{desc: "a verified re-use is >= 100x faster than the registry re-check (p50), registry 2 ms away", value: func(r *result) float64 { return 1 / r.p50Ratio(1) }, min: 100}},
			}
		}),
	)
}

// ensureMemory is the rssTarget, after the ensure scenarios.
var ensureMemory = measurement{
	name:  "ensure: daemon memory with 100,000 records",
	needs: []part{ensureProxies},
	run: func(e *benchEnv, rep *report) error {
		if desc, v, max := e.rssTarget(); desc != "" {
			rep.extra = append(rep.extra, extraTarget{desc: desc, value: v, max: max})
		}
		return nil
	},
}

// rssTarget is the daemon's resident memory with 100,000 records, after
// the scenarios ran against it and a garbage collection (which runs every
// gcInterval on a node) ran on it: the steady state, whatever the bench's
// length.
func (e *benchEnv) rssTarget() (string, float64, float64) {
	c, err := admin.Dial(e.ensure.largeAdmin)
	if err != nil {
		return "", 0, 0
	}
	before := memory(e.ensure.largePid)
	if _, err := c.GC(context.Background()); err != nil {
		e.logf("gc on the 100,000-record daemon: %v", err)
		return "", 0, 0
	}
	after := memory(e.ensure.largePid)
	e.logf("the 100,000-record daemon before a GC: %s; after: %s", before, after)
	if after["VmRSS"] == 0 {
		return "", 0, 0
	}
	return "RSS of the daemon with 100,000 records, after a GC run, MiB (<= 64)", after["VmRSS"], 64
}

// memory is the VmRSS (VmHWM: its peak), RssAnon and RssFile of a
// process, in MiB.
type memoryFigures map[string]float64

func memory(pid int) memoryFigures {
	m := memoryFigures{}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			switch k := strings.TrimSuffix(f[0], ":"); k {
			case "VmRSS", "VmHWM", "RssAnon", "RssFile":
				kb, _ := strconv.Atoi(f[1])
				m[k] = float64(kb) / 1024
			}
		}
	}
	return m
}

func (m memoryFigures) String() string {
	return fmt.Sprintf("RSS %.1f MiB (anonymous %.1f, file %.1f)", m["VmRSS"], m["RssAnon"], m["RssFile"])
}
