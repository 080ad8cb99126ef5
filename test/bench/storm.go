package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The pod-start storm: what a node meets when another is drained onto it.
// A real kubelet is given 110 pods at once (its default pod limit), on
// the proxy (ensure on, the Kubernetes API on, a token plugin) and on the
// runtime directly (the same plugin run by the kubelet itself), in
// alternating rounds so that drift of the machine hits both arms alike.
//
// The pods are three tenants': two with pull secrets of their own (alice,
// bob) and one whose service account's token a plugin turns into a
// credential (KEP-4412). Most run an image already on the node (verified
// for that tenant before: through the proxy a re-check), some an image
// shared by both secret tenants, and some images new to the node, a
// different set each round (a pull; through the proxy, verified).
const (
	stormPods = 110
	// stormAudience is the token scenario's: the part that set the API up
	// allowed nodes to ask for it (deploy/kubernetes/token-audiences.yaml).
	stormAudience = tokenAudience
	stormTokenKey = "registry.test/user"
)

// stormTenant is one tenant of the storm: its namespace, and the registry
// user its pull secret names ("" for the token tenant).
type stormTenant struct {
	name, namespace, secretUser string
}

var stormTenants = []stormTenant{
	{name: "a", namespace: "storm-a", secretUser: "alice"},
	{name: "b", namespace: "storm-b", secretUser: "bob"},
	{name: "t", namespace: "storm-t"}, // the token plugin's: user "user"
}

// stormImage is the image of pod i (of the round's 110) of tenant t:
// six in ten an image of its own already present, one in ten the shared
// present image, two in ten a new image of its own, one in ten the
// round's new shared image (the token tenant's pods run its own instead:
// the plugin matches its repositories alone).
func (s *stormEnv) stormImage(t stormTenant, i, round int) (image, kind string) {
	switch k := (i / len(stormTenants)) % 10; {
	case k < 6 || (k == 6 && t.secretUser == ""):
		return s.present(t), "present"
	case k == 6:
		return s.registry + "/storm/shared-app:v1", "present, shared"
	case k < 9 || t.secretUser == "":
		return s.newImage(t.name, round), "new"
	default:
		return s.newImage("shared", round), "new, shared"
	}
}

// class is how the report groups a tenant's pods of an image kind.
func (t stormTenant) class(kind string) string {
	if t.secretUser == "" {
		return kind + " (token plugin)"
	}
	return kind + " (pull secret)"
}

func (s *stormEnv) present(t stormTenant) string {
	return fmt.Sprintf("%s/storm/%s/app:v1", s.registry, t.name)
}

func (s *stormEnv) newImage(owner string, round int) string {
	return fmt.Sprintf("%s/storm/%s/new:r%d", s.registry, owner, round)
}

// stormEnv is the storm's set-up: the proxy, the two taps, the plugin.
type stormEnv struct {
	registry          string
	proxyPid          int
	taps              [2]*criTap // on the proxy, on the runtime
	proxysCalls       *criTap    // between the proxy and the runtime (-profile storm)
	kubeletPluginArgs []string   // the direct arm's kubelet runs the plugin
}

// stormArm is one arm's measurements over its rounds.
type stormArm struct {
	name        string
	proxyCPU    []time.Duration  // per storm (the proxied arm)
	proxyPeak   float64          // MiB, the largest of its storms
	wall        []time.Duration  // first create to last Running
	runtimeCPU  []time.Duration  // containerd's, per storm
	proxysCalls []map[string]int // the proxy's own calls to the runtime, per storm
	// With -profile storm: the runtime's ImageStatus as the proxy waits
	// for it, and the proxy's Kubernetes API requests by method, per storm.
	runtimesStatus []time.Duration
	apiRequests    []map[string]int
	// statusSplit is each of the kubelet's ImageStatus calls on the proxy
	// paired with the runtime's answer to it: the proxy's time before it
	// asked, the runtime's, and the proxy's after; unpaired counts those
	// with no such call.
	statusSplit [3][]time.Duration
	unpaired    int
	nodeCPU     []time.Duration            // every process's (/proc/stat), per storm
	byClass     map[string][]time.Duration // pod start by the class of its image and tenant
	byProcess   []map[string]time.Duration // CPU by process name, per storm
	// perRound are each storm's pod starts and CRI call durations, for
	// the ratios taken within a round.
	perRound []stormRoundFigures
}

type stormRoundFigures struct {
	podStart []time.Duration
	calls    map[string][]time.Duration // by CRI method, during the storm
}

// podStarts are the arm's pod starts over every round.
func (a *stormArm) podStarts() []time.Duration {
	var out []time.Duration
	for _, r := range a.perRound {
		out = append(out, r.podStart...)
	}
	return out
}

// callsOf are the durations of the arm's calls of method over every round.
func (a *stormArm) callsOf(method string) []time.Duration {
	var out []time.Duration
	for _, r := range a.perRound {
		out = append(out, r.calls[method]...)
	}
	return out
}

func stormMeasurement(rounds int) measurement {
	return measurement{name: "storm", needs: []part{kubeAPI}, run: func(e *benchEnv, rep *report) error {
		e.logf("storm: %d pods at once, %d rounds per arm, with a real kubelet", stormPods, rounds)
		arms, err := e.storm(rounds)
		if err != nil {
			return err
		}
		section, targets := renderStorm(arms)
		rep.sections = append(rep.sections, section)
		rep.extra = append(rep.extra, targets...)
		return nil
	}}
}

// storm sets the tenants and images up, then runs the rounds.
func (e *benchEnv) storm(rounds int) ([]*stormArm, error) {
	ctx := context.Background()
	s, stop, err := e.setUpStorm(ctx, rounds)
	if err != nil {
		return nil, err
	}
	defer stop()
	arms := []*stormArm{{name: "kubelet on the proxy (ensure on, API, token plugin)"}, {name: "kubelet on containerd directly (its own plugin)"}}
	for _, a := range arms {
		a.byClass = map[string][]time.Duration{}
	}
	for round := range rounds {
		// Which arm goes first alternates too: a round's second storm
		// meets the node as its first left it.
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			a := arms[i]
			if err := e.stormRound(ctx, s, a, i, round); err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", a.name, round+1, err)
			}
		}
	}
	return arms, nil
}

// setUpStorm creates the tenants (namespaces, pull secrets, the token
// tenant's service account), pushes the images, puts the present ones on
// the node through the proxy for their tenants, and starts the proxy and
// the taps. The returned function stops what it started.
func (e *benchEnv) setUpStorm(ctx context.Context, rounds int) (*stormEnv, func(), error) {
	k := e.token.kube
	s := &stormEnv{registry: e.rig.Registry}
	var stops []func()
	stop := func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	fail := func(err error) (*stormEnv, func(), error) { stop(); return nil, nil, err }

	for _, t := range stormTenants {
		if err := k.CreateNamespace(ctx, t.namespace); err != nil {
			return fail(err)
		}
		if t.secretUser == "" {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: t.namespace, Name: "builder",
				Annotations: map[string]string{stormTokenKey: "user"}}}
			if _, err := k.Admin.CoreV1().ServiceAccounts(t.namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
				return fail(err)
			}
			continue
		}
		secret, _ := json.Marshal(map[string]any{"auths": map[string]any{e.rig.Registry: map[string]string{"username": t.secretUser, "password": rig.Users[t.secretUser]}}})
		if _, err := k.Admin.CoreV1().Secrets(t.namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
			Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: secret}}, metav1.CreateOptions{}); err != nil {
			return fail(err)
		}
	}

	// The images: each tenant's present one, the shared one, and every
	// round's new ones (each round its own, so each is new to the node).
	var refs, markers []string
	add := func(image string) {
		refs = append(refs, strings.TrimPrefix(image, s.registry+"/"))
		markers = append(markers, image)
	}
	for _, t := range stormTenants {
		add(s.present(t))
	}
	add(s.registry + "/storm/shared-app:v1")
	for round := range rounds {
		for _, owner := range []string{"a", "b", "t", "shared"} {
			add(s.newImage(owner, round))
		}
	}
	e.logf("storm: pushing %d images", len(refs))
	if _, err := e.rig.PushBusyboxes(refs, markers, 4); err != nil {
		return fail(err)
	}

	// The token plugin, for the proxy and for the kubelet on the runtime.
	dir := filepath.Join(e.work, "storm")
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fail(err)
	}
	plugin := filepath.Join(binDir, "sa-token-credential-provider")
	if out, err := exec.Command("go", "build", "-o", plugin, "./cmd/sa-token-credential-provider").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("build plugin: %v: %s", err, out))
	}
	creds := filepath.Join(dir, "credentials")
	if err := os.WriteFile(creds, []byte("user:"+rig.Users["user"]+"\n"), 0o600); err != nil {
		return fail(err)
	}
	cfg := filepath.Join(dir, "providers.yaml")
	y := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: sa-token-credential-provider
    matchImages: ["%s/storm/t"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--for-tests-only", "--audience", "%s", "--credentials", "%s"]
    tokenAttributes:
      serviceAccountTokenAudience: %s
      cacheType: ServiceAccount
      requireServiceAccount: true
      requiredServiceAccountAnnotationKeys: ["%s"]
`, s.registry, stormAudience, creds, stormAudience, stormTokenKey)
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		return fail(err)
	}
	s.kubeletPluginArgs = []string{"--image-credential-provider-config=" + cfg, "--image-credential-provider-bin-dir=" + binDir}

	kubeconfig, err := k.WriteKubeconfig(kuberig.NodeUser)
	if err != nil {
		return fail(err)
	}
	sock := filepath.Join(e.rig.Dir, "bench-storm.sock")
	// With -profile storm, the proxy reaches containerd through a tap too:
	// what it asks the runtime during a storm beyond the kubelet's calls.
	// (Not otherwise: the hop would slow the proxied arm alone.)
	runtimeEndpoint := "unix://" + e.rig.RuntimeSock
	if e.opts.profile == "storm" {
		runtimeTap := filepath.Join(e.rig.Dir, "bench-storm-runtime-tap.sock")
		if s.proxysCalls, err = startTap(runtimeTap, runtimeEndpoint); err != nil {
			return fail(err)
		}
		stops = append(stops, s.proxysCalls.stop)
		runtimeEndpoint = "unix://" + runtimeTap
	}
	args := []string{"--log-level", "info", "--ensure-secret-pulled-images", "--runtime-endpoint", runtimeEndpoint,
		"--ensure-database", filepath.Join(dir, "ensure.db"), "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--kubeconfig", kubeconfig, "--node-name", kuberig.NodeName,
		"--image-credential-provider-config", cfg, "--image-credential-provider-bin-dir", binDir}
	if e.opts.profile == "storm" {
		args = append(args, e.profiled("proxy-storm")...)
	}
	proxy, err := e.rig.StartProxy(e.opts.proxy, sock, args...)
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() { proxy.Stop(10 * time.Second) })
	s.proxyPid = proxy.Pid()

	// The present images, pulled through the proxy by their tenants (the
	// token tenant's credential is the one its plugin gives).
	for _, t := range stormTenants {
		user := t.secretUser
		if user == "" {
			user = "user"
		}
		if res := e.rig.Crictl(ctx, "unix://"+sock, "pull", "--creds", user+":"+rig.Users[user], s.present(t)); res.Err != nil {
			return fail(fmt.Errorf("pull %s: %v: %s", s.present(t), res.Err, res.Stderr))
		}
	}
	if res := e.rig.Crictl(ctx, "unix://"+sock, "pull", "--creds", "alice:"+rig.Users["alice"], s.registry+"/storm/shared-app:v1"); res.Err != nil {
		return fail(fmt.Errorf("pull the shared image: %v: %s", res.Err, res.Stderr))
	}

	for i, upstream := range []string{"unix://" + sock, "unix://" + e.rig.RuntimeSock} {
		t, err := startTap(filepath.Join(e.rig.Dir, fmt.Sprintf("bench-storm-tap%d.sock", i)), upstream)
		if err != nil {
			return fail(err)
		}
		stops = append(stops, t.stop)
		s.taps[i] = t
	}
	return s, stop, nil
}

// stormRound starts a kubelet on arm i's tap, gives it the round's 110
// pods at once, waits until every one runs, and takes it all down again.
func (e *benchEnv) stormRound(ctx context.Context, s *stormEnv, a *stormArm, i, round int) error {
	k := e.token.kube
	opts := kuberig.KubeletOptions{Bin: kuberig.KubeletBin(e.rig, kuberig.KubeVersion), CRIEndpoint: "unix://" + filepath.Join(e.rig.Dir, fmt.Sprintf("bench-storm-tap%d.sock", i)),
		// The kubelet's pull rate limit (5/s, burst 10) refuses a storm's
		// new-image pods' pulls beyond the burst ("pull QPS exceeded"), and
		// each refused pod backs off 10 s: a storm then takes 30 s instead
		// of 20, on either arm, depending on how its pulls fell. Off, so that
		// what the arms differ by is the proxy.
		Config: map[string]any{"registryPullQPS": 0}}
	if i == 1 {
		opts.ExtraArgs = s.kubeletPluginArgs
	}
	node, err := kuberig.StartNode(e.rig, k, opts)
	if err != nil {
		return err
	}
	// The round's own context below is cancelled before this runs: the
	// sandboxes are removed under the caller's.
	defer func(ctx context.Context) {
		node.Stop()
		if err := kuberig.RemoveKubeletPods(ctx, e.rig); err != nil {
			e.logf("storm: removing the round's sandboxes: %v", err)
		}
	}(ctx)
	tap := s.taps[i]
	tap.forget()
	label := fmt.Sprintf("r%d-%d", round, i)

	// Watch every tenant's pods of this round before the first exists.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	w, err := k.Admin.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{LabelSelector: "storm=" + label})
	if err != nil {
		return err
	}
	defer w.Stop()

	if addr, ok := e.monitors["proxy-storm"]; ok && i == 0 && round == 0 {
		// The first proxied storm's profile: -profile storm.
		profiled := make(chan struct{})
		defer func() { <-profiled }()
		go func() {
			defer close(profiled)
			e.fetchProfile(addr, filepath.Join(e.opts.out, "storm-proxy-cpu.pprof"), 30*time.Second)
		}()
		traced := make(chan struct{})
		defer func() { <-traced }()
		go func() {
			defer close(traced)
			e.fetchTrace(addr, filepath.Join(e.opts.out, "storm-proxy.trace"), 30*time.Second)
		}()
	}
	apiBefore := e.apiRequests(i)
	clearPeakRSS(s.proxyPid)
	proxyCPU, runtimeCPU, nodeCPU, procs := processCPU(s.proxyPid), processCPU(e.rig.RuntimeProc().Pid()), machineCPU(), readProcessTimes()
	begin := time.Now()
	created, classes, err := createStormPods(ctx, k, s, label, round)
	if err != nil {
		return err
	}
	running := map[string]time.Time{}
	for len(running) < len(created) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d pods Running after 10 minutes\nkubelet log:\n%s", len(running), len(created), tail(node.Log(), 30))
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("the watch ended with %d of %d pods Running", len(running), len(created))
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if ev.Type == watch.Error || !isPod {
				continue
			}
			key := p.Namespace + "/" + p.Name
			for _, st := range p.Status.ContainerStatuses {
				if st.State.Running != nil {
					if _, seen := running[key]; !seen {
						running[key] = time.Now()
					}
				}
				if w := st.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "" {
					return fmt.Errorf("pod %s: %s: %s", key, w.Reason, w.Message)
				}
			}
		}
	}
	end := time.Now()
	if i == 0 {
		a.proxyCPU = append(a.proxyCPU, processCPU(s.proxyPid)-proxyCPU)
		a.proxyPeak = max(a.proxyPeak, memory(s.proxyPid)["VmHWM"])
	}
	a.runtimeCPU = append(a.runtimeCPU, processCPU(e.rig.RuntimeProc().Pid())-runtimeCPU)
	a.nodeCPU = append(a.nodeCPU, machineCPU()-nodeCPU)
	a.byProcess = append(a.byProcess, cpuByName(procs, readProcessTimes()))
	if i == 0 && s.proxysCalls != nil {
		// What the runtime was asked beyond what the kubelet asked the
		// proxy (negative: answered by the proxy without the runtime).
		asked, forwarded := s.proxysCalls.counts(begin, end), tap.counts(begin, end)
		for m, n := range forwarded {
			asked[m] -= n
		}
		a.proxysCalls = append(a.proxysCalls, asked)
		a.runtimesStatus = append(a.runtimesStatus, s.proxysCalls.between("ImageStatus", begin, end)...)
		a.splitStatus(tap.callsOf("ImageStatus", begin, end), s.proxysCalls.callsOf("ImageStatus", begin, end))
	}
	if apiBefore != nil {
		after := e.apiRequests(i)
		for m := range after {
			after[m] -= apiBefore[m]
		}
		a.apiRequests = append(a.apiRequests, after)
	}
	a.wall = append(a.wall, end.Sub(begin))
	fig := stormRoundFigures{calls: map[string][]time.Duration{}}
	for key, at := range running {
		fig.podStart = append(fig.podStart, at.Sub(created[key]))
		a.byClass[classes[key]] = append(a.byClass[classes[key]], at.Sub(created[key]))
	}
	for _, m := range []string{"ImageStatus", "PullImage", "CreateContainer", "RunPodSandbox", "StartContainer"} {
		fig.calls[m] = tap.between(m, begin, end)
	}
	a.perRound = append(a.perRound, fig)
	e.logf("storm: %s, round %d: %d pods Running in %v", a.name, round+1, len(running), end.Sub(begin).Round(time.Millisecond))

	for _, t := range stormTenants {
		deletePodsIn(ctx, k, t.namespace)
	}
	// The round's new images leave the node, as they came.
	images := runtimeapi.NewImageServiceClient(e.direct)
	for _, owner := range []string{"a", "b", "t", "shared"} {
		if _, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: s.newImage(owner, round)}}); err != nil {
			return fmt.Errorf("remove %s: %w", s.newImage(owner, round), err)
		}
	}
	return nil
}

// createStormPods creates the round's pods, 16 creates at a time (the
// API's answer takes milliseconds: they all exist within a second), and
// returns when each was asked for, by namespace/name.
func createStormPods(ctx context.Context, k *kuberig.Kube, s *stormEnv, label string, round int) (created map[string]time.Time, classes map[string]string, err error) {
	created, classes = map[string]time.Time{}, map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, stormPods)
	sem := make(chan struct{}, 16)
	no, zero := false, int64(0)
	for i := range stormPods {
		t := stormTenants[i%len(stormTenants)]
		image, kind := s.stormImage(t, i, round)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-p%03d", label, i), Namespace: t.namespace, Labels: map[string]string{"storm": label}},
			Spec: corev1.PodSpec{NodeName: kuberig.NodeName, AutomountServiceAccountToken: &no, DNSPolicy: corev1.DNSDefault,
				TerminationGracePeriodSeconds: &zero,
				Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sleep", "3600"}}}}}
		if t.secretUser != "" {
			pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		} else {
			pod.Spec.ServiceAccountName = "builder"
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			at := time.Now()
			if _, err := k.Admin.CoreV1().Pods(t.namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			mu.Lock()
			created[t.namespace+"/"+pod.Name] = at
			classes[t.namespace+"/"+pod.Name] = t.class(kind)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	return created, classes, <-errs
}

// deletePodsIn deletes a namespace's pods while the kubelet runs (it stops
// their containers) and waits until they are gone.
func deletePodsIn(ctx context.Context, k *kuberig.Kube, namespace string) {
	zero := int64(0)
	pods := k.Admin.CoreV1().Pods(namespace)
	pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	for range 600 {
		if l, err := pods.List(ctx, metav1.ListOptions{}); err == nil && len(l.Items) == 0 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// machineCPU is the CPU time every process of the machine has used since
// boot (/proc/stat: all but idle and iowait), 0 when unreadable.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest time is in user already
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// processTimes is each process's CPU time (its own and its reaped
// children's, in USER_HZ ticks) by PID, with its name.
type processTimes map[int]processTime

type processTime struct {
	comm  string
	ticks int64
}

// readProcessTimes reads /proc/PID/stat of every process.
func readProcessTimes() processTimes {
	out := processTimes{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		open, close := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(string(b)[close+1:])
		if len(f) < 15 {
			continue
		}
		var ticks int64
		for _, v := range f[11:15] { // utime stime cutime cstime
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		out[pid] = processTime{comm: string(b)[open+1 : close], ticks: ticks}
	}
	return out
}

// cpuByName is the CPU each process name used from before to after
// (processes that began meanwhile count from zero).
func cpuByName(before, after processTimes) map[string]time.Duration {
	out := map[string]time.Duration{}
	for pid, a := range after {
		d := a.ticks
		if b, ok := before[pid]; ok && b.comm == a.comm {
			d -= b.ticks
		}
		out[a.comm] += time.Duration(d) * time.Second / 100
	}
	return out
}

// clearPeakRSS resets a process's peak RSS (VmHWM) to its current RSS, so
// that the peak read after a storm is that storm's.
func clearPeakRSS(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0o200)
}

// quantile of durations, nearest rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

// renderStorm writes the storm's section and returns its targets.
func renderStorm(arms []*stormArm) (string, []extraTarget) {
	p, d := arms[0], arms[1]
	ms := func(x time.Duration) string { return fmt.Sprintf("%.1f", float64(x)/float64(time.Millisecond)) }
	ratio := func(a, b time.Duration) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Pod-start storm (a real kubelet %s, %d pods at once)\n\n", kuberig.KubeVersion, stormPods)
	b.WriteString("Three tenants (two pull secrets, one service-account token plugin: the proxy's on the proxied arm, the kubelet's own on the direct one); per round 6 in 10 pods on an image of their tenant already on the node, 1 in 10 on one shared by the secret tenants, 3 in 10 on images new to the node (4 per round). Arms alternate round by round. Pod start is from the pod's creation in the API to its container Running; the CRI calls are timed by a frame-forwarding tap in front of either arm, from the request's arrival to the upstream's answer.\n\n")
	b.WriteString("| arm | pods | pod start p50 ms | p99 ms | storm wall s (median) | ImageStatus p50/p99 ms | PullImage p50/p99 ms | CreateContainer p50/p99 ms | RunPodSandbox p50/p99 ms | containerd CPU-s / storm | node CPU-s / storm |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range arms {
		pair := func(m string) string {
			calls := a.callsOf(m)
			return fmt.Sprintf("%s / %s (%d)", ms(quantile(calls, 0.5)), ms(quantile(calls, 0.99)), len(calls))
		}
		starts := a.podStarts()
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %.1f | %s | %s | %s | %s | %.2f | %.2f |\n", a.name, len(starts), ms(quantile(starts, 0.5)), ms(quantile(starts, 0.99)),
			quantile(a.wall, 0.5).Seconds(), pair("ImageStatus"), pair("PullImage"), pair("CreateContainer"), pair("RunPodSandbox"), quantile(a.runtimeCPU, 0.5).Seconds(), quantile(a.nodeCPU, 0.5).Seconds())
	}
	fmt.Fprintf(&b, "\nThe proxy during the proxied storms: %.2f CPU-s per storm (median; each: %s), peak RSS %.1f MiB. Its own calls to the runtime per storm, beyond those of the kubelet's it forwards (-profile storm): %s.\n",
		quantile(p.proxyCPU, 0.5).Seconds(), secondsList(p.proxyCPU), p.proxyPeak, callCounts(p.proxysCalls))
	if len(p.runtimesStatus) > 0 {
		fmt.Fprintf(&b, "The runtime's ImageStatus as the proxy waited for it (-profile storm, through a tap of its own): p50 %s ms, p99 %s ms (%d calls); the proxy's Kubernetes API requests per storm (median): %s.\n",
			ms(quantile(p.runtimesStatus, 0.5)), ms(quantile(p.runtimesStatus, 0.99)), len(p.runtimesStatus), callCounts(p.apiRequests))
		fmt.Fprintf(&b, "The kubelet's ImageStatus on the proxy, each paired with the runtime's answer to it (%d paired, %d not): p50 / p99 ms the proxy's before it asked %s / %s, the runtime's %s / %s, the proxy's after %s / %s.\n",
			len(p.statusSplit[0]), p.unpaired, ms(quantile(p.statusSplit[0], 0.5)), ms(quantile(p.statusSplit[0], 0.99)),
			ms(quantile(p.statusSplit[1], 0.5)), ms(quantile(p.statusSplit[1], 0.99)), ms(quantile(p.statusSplit[2], 0.5)), ms(quantile(p.statusSplit[2], 0.99)))
	}
	b.WriteString("\n| pods (image, tenant) | " + p.name + ": p50 / p99 ms | " + d.name + ": p50 / p99 ms |\n|---|---|---|\n")
	for _, c := range slices.Sorted(maps.Keys(d.byClass)) {
		fmt.Fprintf(&b, "| %s | %s / %s (%d) | %s / %s (%d) |\n", c, ms(quantile(p.byClass[c], 0.5)), ms(quantile(p.byClass[c], 0.99)), len(p.byClass[c]),
			ms(quantile(d.byClass[c], 0.5)), ms(quantile(d.byClass[c], 0.99)), len(d.byClass[c]))
	}
	b.WriteString("\nCPU-s per storm (median) of the processes that used the most, by name:\n\n| process | " + p.name + " | " + d.name + " |\n|---|---|---|\n")
	for _, name := range topProcesses(append(slices.Clone(p.byProcess), d.byProcess...), 10) {
		fmt.Fprintf(&b, "| %s | %.2f | %.2f |\n", name, medianCPU(p.byProcess, name).Seconds(), medianCPU(d.byProcess, name).Seconds())
	}
	// The targets are ratios taken within a round (a proxied storm and the
	// direct one beside it), their median over the rounds, as the
	// scenarios' are: a 2-core node's storm varies by 10-20 % from one
	// round to the next, more than the proxy's part of it.
	withinRounds := func(f func(stormRoundFigures) time.Duration) (float64, string) {
		var rs []float64
		for i := range min(len(p.perRound), len(d.perRound)) {
			rs = append(rs, ratio(f(p.perRound[i]), f(d.perRound[i])))
		}
		var parts []string
		for _, r := range rs {
			parts = append(parts, fmt.Sprintf("%.3f", r))
		}
		slices.Sort(rs)
		if len(rs) == 0 {
			return 0, ""
		}
		return rs[len(rs)/2], strings.Join(parts, ", ")
	}
	b.WriteString("\nRatios within each round (the proxied storm / the direct storm beside it; the arm that goes first alternates), their median the target's figure:\n\n| ratio | median | each round |\n|---|---|---|\n")
	var targets []extraTarget
	for _, t := range []struct {
		desc string
		max  float64
		f    func(stormRoundFigures) time.Duration
	}{
		{"storm: pod start p50, on the proxy / direct (goal 1.05)", 1.05, func(r stormRoundFigures) time.Duration { return quantile(r.podStart, 0.5) }},
		{"storm: pod start p99, on the proxy / direct (goal 1.05)", 1.05, func(r stormRoundFigures) time.Duration { return quantile(r.podStart, 0.99) }},
		{"storm: the kubelet's ImageStatus p99, on the proxy / direct (goal 1.25)", 1.25, func(r stormRoundFigures) time.Duration { return quantile(r.calls["ImageStatus"], 0.99) }},
		{"storm: the kubelet's CreateContainer p99, on the proxy / direct (goal 1.25)", 1.25, func(r stormRoundFigures) time.Duration { return quantile(r.calls["CreateContainer"], 0.99) }},
	} {
		median, each := withinRounds(t.f)
		fmt.Fprintf(&b, "| %s | %.3f | %s |\n", strings.TrimPrefix(t.desc, "storm: "), median, each)
		targets = append(targets, extraTarget{desc: t.desc, value: median, max: t.max})
	}
	return b.String(), targets
}

// topProcesses names the n processes with the most CPU over storms.
func topProcesses(storms []map[string]time.Duration, n int) []string {
	total := map[string]time.Duration{}
	for _, st := range storms {
		for name, d := range st {
			total[name] += d
		}
	}
	names := slices.Collect(maps.Keys(total))
	slices.SortFunc(names, func(a, b string) int { return int(total[b] - total[a]) })
	return names[:min(n, len(names))]
}

func medianCPU(storms []map[string]time.Duration, name string) time.Duration {
	var ds []time.Duration
	for _, st := range storms {
		ds = append(ds, st[name])
	}
	return quantile(ds, 0.5)
}

// callCounts lists each method's calls per storm (their median).
func callCounts(storms []map[string]int) string {
	methods := map[string]bool{}
	for _, m := range storms {
		for k := range m {
			methods[k] = true
		}
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(methods)) {
		var n []time.Duration // counts, as durations for quantile
		for _, st := range storms {
			n = append(n, time.Duration(st[m]))
		}
		parts = append(parts, fmt.Sprintf("%s %d", m, quantile(n, 0.5)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func secondsList(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%.2f", d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// apiRequests reads the profiled storm proxy's Kubernetes API requests so
// far, by method and code (rest_client_requests_total); nil when arm i is
// not the proxy's or it is not profiled.
func (e *benchEnv) apiRequests(i int) map[string]int {
	addr, ok := e.monitors["proxy-storm"]
	if !ok || i != 0 {
		return nil
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		e.logf("storm: the proxy's metrics: %v", err)
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		e.logf("storm: the proxy's metrics: %v", err)
		return nil
	}
	out := map[string]int{}
	for _, m := range fams["rest_client_requests_total"].GetMetric() {
		var method, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "method":
				method = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		out[method+" "+code] += int(m.GetCounter().GetValue())
	}
	return out
}

// splitStatus pairs each of the kubelet's ImageStatus calls on the proxy
// with the first call of the same request the proxy made to the runtime
// within it, and keeps the three parts of its time.
func (a *stormArm) splitStatus(kubelets, runtimes []tappedCall) {
	for _, k := range kubelets {
		kEnd := k.start.Add(k.took)
		i := slices.IndexFunc(runtimes, func(r tappedCall) bool {
			return r.request == k.request && !r.start.Before(k.start) && !r.start.Add(r.took).After(kEnd)
		})
		if i < 0 {
			a.unpaired++
			continue
		}
		r := runtimes[i]
		runtimes = slices.Delete(runtimes, i, i+1)
		a.statusSplit[0] = append(a.statusSplit[0], r.start.Sub(k.start))
		a.statusSplit[1] = append(a.statusSplit[1], r.took)
		a.statusSplit[2] = append(a.statusSplit[2], kEnd.Sub(r.start.Add(r.took)))
	}
}
