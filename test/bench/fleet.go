package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// The fleet measurement: N nodes' API clients against the rig's one
// kube-apiserver and etcd, to show what the proxies cost the control
// plane next to the kubelets. Three phases run the same pod churn:
//   - "no node clients": the churn alone (the admin's creates and deletes);
//   - "kubelets": N kubelet-like clients, each the kubelet's pod watch of
//     its node (a reflector on pods with spec.nodeName=NODE, as its config
//     source has);
//   - "kubelets and proxies": the same, plus N proxies' API clients, the
//     daemon's own code (podtoken.Source, with the node's identity: its
//     node-scoped pod informer, service-account GETs, TokenRequests with
//     their cache), the token plugin on every other node: for each pod
//     start there, what a pull through the token plugin asks (the pod, a
//     live GET of its account, a token for the audience, twice: the
//     second pull of the same pod must not mint again).
//
// The kubelets' cost is phase 2 over phase 1, the proxies' watches phase 3
// over the mean of phases 2 and 5 (the kubelets alone again: the
// apiserver drifts), the token plugin's pulls phase 4 over phase 3, all measured
// on the apiserver: requests by verb, watches open, TokenRequests, its CPU
// and memory.

const (
	fleetNamespace = "fleet"
	// fleetRounds pod starts per node, each pod created, seen by its
	// node's clients, then deleted; a round takes at least fleetRound, so
	// that the churn's rate is the same in every phase and what differs is
	// the node clients' share.
	fleetRounds = 3
	fleetRound  = 8 * time.Second
)

// fleetMeasurement runs the fleet of n nodes. What decides the proxies'
// cost is deterministic: one pod watch per node with the kubelet's
// selector, and no request of their own while no pull needs the API. The
// apiserver's CPU and memory at 100 nodes move by less than their noise
// (reported only).
func fleetMeasurement(n int) measurement {
	return measurement{name: "fleet", needs: []part{kubeAPI}, run: func(e *benchEnv, rep *report) error {
		e.logf("fleet: %d nodes' API clients, kubelets' and proxies', against one kube-apiserver", n)
		phases, err := e.fleet(n)
		if err != nil {
			return err
		}
		section, _ := renderFleet(n, phases)
		rep.sections = append(rep.sections, section)
		if len(phases) == 5 {
			none, kubelets, proxies, tokens := phases[0], phases[1], phases[2], phases[3]
			rep.extra = append(rep.extra,
				extraTarget{desc: "TokenRequests per pod start on a token node, two pulls each (goal 1)", value: tokens.tokenRequests / float64(max(tokens.tokenStarts, 1)), max: 1},
				extraTarget{desc: fmt.Sprintf("pod watches of %d proxies over %d kubelets' (goal 1)", n, n), value: (proxies.watches - kubelets.watches) / max(kubelets.watches-none.watches, 1), max: 1},
				extraTarget{desc: "requests per second per node the proxies add with no pull needing the API, over the kubelets' (goal <= their +0.01)", value: (proxies.total()-kubelets.total())/float64(n) - (kubelets.total()-none.total())/float64(n), max: 0.01})
		}
		return nil
	}}
}

func fleetNode(i int) string { return fmt.Sprintf("fleet-%03d", i) }
func fleetUser(i int) string { return "system:node:" + fleetNode(i) }

// fleetUsers are the nodes' identities, for the apiserver's token file.
func fleetUsers(n int) []kuberig.User {
	var out []kuberig.User
	for i := range n {
		out = append(out, kuberig.User{Name: fleetUser(i), Groups: []string{"system:nodes"}})
	}
	return out
}

// fleetPhase is what one phase cost the apiserver.
type fleetPhase struct {
	name          string
	wall          time.Duration
	requests      map[string]float64 // by verb, non-watch requests answered during the phase
	watches       float64            // pod watches open at the end of the phase
	tokenRequests float64
	tokenStarts   int // pod starts on token nodes
	cpu           time.Duration
	rssMiB        float64
}

func (p fleetPhase) rate(verb string) float64 { return p.requests[verb] / p.wall.Seconds() }

func (p fleetPhase) total() float64 {
	var t float64
	for _, v := range p.requests {
		t += v
	}
	return t / p.wall.Seconds()
}

// nodeConfig is a node identity's client configuration, with the daemon's
// defaults (the kubelet's QPS and burst).
func nodeConfig(k *kuberig.Kube, user, agent string) *rest.Config {
	return &rest.Config{Host: k.Server, BearerToken: k.Tokens[user], TLSClientConfig: rest.TLSClientConfig{CAData: k.CA},
		QPS: config.DefaultKubernetesQPS, Burst: config.DefaultKubernetesBurst, UserAgent: agent}
}

func (e *benchEnv) fleet(n int) ([]fleetPhase, error) {
	k := e.token.kube
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := k.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleetNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: fleetNamespace, Name: "builder"}}
	if _, err := k.Admin.CoreV1().ServiceAccounts(fleetNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var phases []fleetPhase
	measure := func(name string, churn func() (int, error)) error {
		before, err := apiserverMetrics(ctx, k)
		if err != nil {
			return err
		}
		cpu0, start := processCPU(k.APIServerPid()), time.Now()
		starts, err := churn()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		after, err := apiserverMetrics(ctx, k)
		if err != nil {
			return err
		}
		p := fleetPhase{name: name, wall: time.Since(start), cpu: processCPU(k.APIServerPid()) - cpu0, requests: map[string]float64{},
			rssMiB: memory(k.APIServerPid())["VmRSS"], tokenStarts: starts}
		for key, v := range after {
			d := v - before[key]
			switch {
			case strings.HasPrefix(key, "request "):
				verb := strings.Fields(key)[1]
				if verb != "WATCH" {
					p.requests[verb] += d
				}
				if strings.Contains(key, " serviceaccounts token ") && verb == "POST" {
					p.tokenRequests += d
				}
			case key == "watches pods":
				p.watches = v
			}
		}
		phases = append(phases, p)
		e.logf("  fleet %s: %.1f requests/s, %.0f pod watches, %.0f TokenRequests for %d token pod starts, apiserver CPU %.2f s/s",
			name, p.total(), p.watches, p.tokenRequests, starts, p.cpu.Seconds()/p.wall.Seconds())
		return nil
	}
	churn := func(perPod func(i int, pod *corev1.Pod) error) func() (int, error) {
		return func() (int, error) { return e.fleetChurn(ctx, k, n, perPod) }
	}

	if err := measure("no node clients", churn(nil)); err != nil {
		return nil, err
	}

	// The kubelets' pod watches.
	stop := make(chan struct{})
	defer close(stop)
	var kubeletSynced []cache.InformerSynced
	for i := range n {
		cs, err := kubernetes.NewForConfig(nodeConfig(k, fleetUser(i), "kubelet/fleet"))
		if err != nil {
			return nil, err
		}
		lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.OneTermEqualSelector("spec.nodeName", fleetNode(i)))
		inf := cache.NewSharedInformer(lw, &corev1.Pod{}, 0)
		go inf.Run(stop)
		kubeletSynced = append(kubeletSynced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(stop, kubeletSynced...) {
		return nil, fmt.Errorf("the kubelet-like watches did not sync")
	}
	if err := measure("kubelets", churn(nil)); err != nil {
		return nil, err
	}

	// The proxies, the daemon's code with each node's identity.
	proxiesCtx, stopProxies := context.WithCancel(ctx)
	defer stopProxies()
	sources := make([]*podtoken.Source, n)
	for i := range n {
		api, err := podtoken.NewAPI(nodeConfig(k, fleetUser(i), "cri-image-proxy/fleet"))
		if err != nil {
			return nil, err
		}
		sources[i] = podtoken.New(api, fleetNode(i), podtoken.Options{})
		sources[i].Start(proxiesCtx)
	}
	for i, s := range sources {
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		ok := s.WaitForSync(wctx)
		wcancel()
		if !ok {
			return nil, fmt.Errorf("the proxy of %s did not sync", fleetNode(i))
		}
	}
	// The proxies' pod watches alone: pods started where no pull needs
	// the API (no token plugin), the proxies' only cost is their watch.
	if err := measure("kubelets and proxies", churn(nil)); err != nil {
		return nil, err
	}
	// Then pulls through the token plugin on every other node: per pod
	// start, what a pull asks (the pod from the informer, a live GET of
	// its account as the kubelet does, a token for the audience), twice:
	// the second pull of the same pod must not mint again.
	err := measure("kubelets and proxies, token plugin on half the nodes", churn(func(i int, pod *corev1.Pod) error {
		src := sources[i]
		// A pull comes once the kubelet has the pod from its watch; the
		// proxy's informer has it by then too.
		if err := waitForPod(ctx, src, pod); err != nil {
			return fmt.Errorf("%s: %w", fleetNode(i), err)
		}
		if i%2 == 1 {
			return nil // no token plugin on this node
		}
		got, err := src.Pod(ctx, pod.Namespace, pod.Name, string(pod.UID))
		if err != nil {
			return fmt.Errorf("%s: pod %s: %w", fleetNode(i), pod.Name, err)
		}
		for range 2 {
			acct, err := src.ServiceAccount(ctx, got.Namespace, got.Spec.ServiceAccountName)
			if err != nil {
				return fmt.Errorf("%s: account: %w", fleetNode(i), err)
			}
			if _, err := src.Token(ctx, got, acct, tokenAudience); err != nil {
				return fmt.Errorf("%s: token: %w", fleetNode(i), err)
			}
		}
		return nil
	}))
	if err != nil {
		return nil, err
	}
	// The kubelets alone again, the proxies stopped: the apiserver drifts
	// (more history in etcd, its caches), and the proxies' cost is taken
	// against the mean of the kubelets' phases before and after.
	stopProxies()
	waitUntilWatches(ctx, k, phases[1].watches)
	if err := measure("kubelets again (proxies stopped)", churn(nil)); err != nil {
		return nil, err
	}
	return phases, nil
}

// waitUntilWatches waits (up to 30s) until the apiserver has n pod
// watches open.
func waitUntilWatches(ctx context.Context, k *kuberig.Kube, n float64) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if m, err := apiserverMetrics(ctx, k); err == nil && m["watches pods"] <= n {
			return
		}
	}
}

// fleetChurn creates fleetRounds pods per node, round by round: the
// round's pods are created, then (after a second, the kubelet's time to
// admit a pod and make its sandbox before it pulls: the Node authorizer's
// graph has the pod by then) perPod runs for each when set, then the pods
// are deleted. It returns how many pod starts were on token nodes (even
// ones) with perPod set.
func (e *benchEnv) fleetChurn(ctx context.Context, k *kuberig.Kube, n int, perPod func(i int, pod *corev1.Pod) error) (int, error) {
	starts := 0
	no, zero := false, int64(0)
	for r := range fleetRounds {
		slot := time.After(fleetRound)
		pods := make([]*corev1.Pod, n)
		err := forEachNode(n, func(i int) error {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fleetNamespace, Name: fmt.Sprintf("%s-r%d", fleetNode(i), r)},
				Spec: corev1.PodSpec{NodeName: fleetNode(i), ServiceAccountName: "builder", AutomountServiceAccountToken: &no,
					Containers: []corev1.Container{{Name: "app", Image: "registry.fleet.test/app:v1"}}}}
			var err error
			pods[i], err = k.Admin.CoreV1().Pods(fleetNamespace).Create(ctx, pod, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return 0, err
		}
		if perPod != nil {
			time.Sleep(time.Second)
			if err := forEachNode(n, func(i int) error { return perPod(i, pods[i]) }); err != nil {
				return 0, err
			}
			starts += (n + 1) / 2
		}
		err = forEachNode(n, func(i int) error {
			return k.Admin.CoreV1().Pods(fleetNamespace).Delete(ctx, pods[i].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		if err != nil {
			return 0, err
		}
		<-slot
	}
	return starts, nil
}

// forEachNode runs f for each node, 16 at a time, and returns the first
// error.
func forEachNode(n int, f func(i int) error) error {
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// waitForPod waits until src's informer holds pod.
func waitForPod(ctx context.Context, src *podtoken.Source, pod *corev1.Pod) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range src.PodsOnNode() {
			if p.UID == pod.UID {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pod %s not in the proxy's informer after 30s", pod.Name)
}

// apiserverMetrics reads the apiserver's request counts, keyed
// "request VERB RESOURCE SUBRESOURCE", and its open pod watches, "watches
// pods".
func apiserverMetrics(ctx context.Context, k *kuberig.Kube) (map[string]float64, error) {
	body, err := k.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("apiserver /metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		switch name {
		case "apiserver_request_total":
			out["request "+labels["verb"]+" "+labels["resource"]+" "+labels["subresource"]+" "] += value
		case "apiserver_longrunning_requests":
			if labels["verb"] == "WATCH" && labels["resource"] == "pods" {
				out["watches pods"] += value
			}
		}
	}
	return out, sc.Err()
}

// parseSample parses one line of the text format: name{labels} value.
func parseSample(line string) (string, map[string]string, float64, bool) {
	if line == "" || line[0] == '#' {
		return "", nil, 0, false
	}
	brace := strings.IndexByte(line, '{')
	end := strings.LastIndexByte(line, '}')
	if brace < 0 || end < brace {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
	if err != nil {
		return "", nil, 0, false
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(line[brace+1:end], ",") {
		if key, val, ok := strings.Cut(kv, "="); ok {
			labels[key] = strings.Trim(val, `"`)
		}
	}
	return line[:brace], labels, v, true
}

// renderFleet reports the phases and the proxies' cost next to the
// kubelets'.
func renderFleet(n int, phases []fleetPhase) (string, float64) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## %d nodes against one kube-apiserver\n\n", n)
	fmt.Fprintf(&b, "The same churn in each phase: %d pods per node created, seen by the node's clients and deleted; the proxies' token plugin on every other node (two pulls per pod). Requests are the apiserver's (apiserver_request_total, watches aside) per second of the phase.\n\n", fleetRounds)
	verbs := map[string]bool{}
	for _, p := range phases {
		for v := range p.requests {
			verbs[v] = true
		}
	}
	var vs []string
	for v := range verbs {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	b.WriteString("| phase | wall s | requests/s | " + strings.Join(vs, "/s | ") + "/s | pod watches | TokenRequests | per token pod start | apiserver CPU s/s | apiserver RSS MiB |\n")
	b.WriteString("|---|---|---|" + strings.Repeat("---|", len(vs)) + "---|---|---|---|---|\n")
	for _, p := range phases {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f |", p.name, p.wall.Seconds(), p.total())
		for _, v := range vs {
			fmt.Fprintf(&b, " %.1f |", p.rate(v))
		}
		per := "-"
		if p.tokenStarts > 0 {
			per = fmt.Sprintf("%.2f", p.tokenRequests/float64(p.tokenStarts))
		}
		fmt.Fprintf(&b, " %.0f | %.0f | %s | %.3f | %.0f |\n", p.watches, p.tokenRequests, per, p.cpu.Seconds()/p.wall.Seconds(), p.rssMiB)
	}
	if len(phases) < 5 {
		return b.String(), 0
	}
	none, kubelets, proxies, tokens, again := phases[0], phases[1], phases[2], phases[3], phases[4]
	cpu := func(p fleetPhase) float64 { return p.cpu.Seconds() / p.wall.Seconds() }
	kubeletsMean := (cpu(kubelets) + cpu(again)) / 2
	kubeletCPU, proxyCPU, tokenCPU := kubeletsMean-cpu(none), cpu(proxies)-kubeletsMean, cpu(tokens)-cpu(proxies)
	ratio := 0.0
	if kubeletCPU > 0 {
		ratio = proxyCPU / kubeletCPU
	}
	starts := float64(max(tokens.tokenStarts, 1))
	fmt.Fprintf(&b, "\nPer node, the kubelet's pod watch cost the apiserver %.2f mCPU-s/s and %.3f requests/s; the proxy's, %.2f mCPU-s/s and %.3f requests/s (%.0f and %.0f watches open): proxies over kubelets, apiserver CPU %.2f. "+
		"The token plugin's pulls cost, per pod start on a token node (two pulls), %.2f TokenRequests, %.2f GETs (the account, live per pull as the kubelet reads it) and %.2f mCPU-s of the apiserver: the work a kubelet running the same plugin does itself. (The apiserver's CPU and memory move by less than their run-to-run noise at this scale, some 0.02 CPU-s/s and 30 MiB: the deterministic figures are the watches and requests.)\n",
		1000*kubeletCPU/float64(n), (kubelets.total()-none.total())/float64(n), 1000*proxyCPU/float64(n), (proxies.total()-kubelets.total())/float64(n),
		kubelets.watches-none.watches, proxies.watches-kubelets.watches, ratio,
		tokens.tokenRequests/starts, (tokens.requests["GET"]-proxies.requests["GET"])/starts, 1000*tokenCPU*tokens.wall.Seconds()/starts)
	return b.String(), ratio
}
