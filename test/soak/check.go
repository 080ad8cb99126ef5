package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
)

// report is the soak's outcome.
type report struct {
	res      *soakResult
	flat     []flatResult
	targets  []target
	missed   []string
	markdown string
	records  recordsCheck
	leaks    []string
	panics   []string
	cycled   string
}

// target is one target and whether it was met.
type target struct {
	desc string
	met  bool
	why  string // the figures, or what missed it
}

// flatResult is one series after the warm-up.
type flatResult struct {
	name, unit     string
	asserted       bool
	n              int     // samples after the warm-up
	first, last    float64 // of the whole run
	warm           float64 // the first sample after the warm-up
	min, max, mean float64 // after the warm-up
	slope          float64 // Theil-Sen, per second
	intercept      float64 // the median of y - slope × t: the fitted line's
	t0, t1         float64 // the span after the warm-up, seconds
	drift          float64 // slope × span
	rel            float64 // |drift| / mean
	ok             bool
}

// flatness fits each series after the warm-up: the Theil-Sen slope times
// the span, against the mean.
func flatness(samples []sample, warmup time.Duration, tol float64) []flatResult {
	var out []flatResult
	for _, sr := range series {
		f := flatResult{name: sr.name, unit: sr.unit, asserted: sr.asserted, first: math.NaN(), last: math.NaN(), warm: math.NaN()}
		var ts, ys []float64
		for _, s := range samples {
			v := sr.get(s)
			if math.IsNaN(v) {
				continue
			}
			if math.IsNaN(f.first) {
				f.first = v
			}
			f.last = v
			if s.at >= warmup {
				if len(ts) == 0 {
					f.warm = v
				}
				ts, ys = append(ts, s.at.Seconds()), append(ys, v)
			}
		}
		f.n = len(ts)
		if f.n >= 3 {
			f.min, f.max = ys[0], ys[0]
			for _, y := range ys {
				f.mean += y / float64(f.n)
				f.min, f.max = math.Min(f.min, y), math.Max(f.max, y)
			}
			f.slope = theilSen(ts, ys)
			var rest []float64
			for i := range ts {
				rest = append(rest, ys[i]-f.slope*ts[i])
			}
			f.intercept = median(rest)
			f.t0, f.t1 = ts[0], ts[len(ts)-1]
			f.drift = f.slope * (f.t1 - f.t0)
			if f.mean != 0 {
				f.rel = math.Abs(f.drift) / math.Abs(f.mean)
			} else if f.drift != 0 {
				f.rel = math.Inf(1)
			}
			f.ok = f.rel <= tol
		}
		out = append(out, f)
	}
	return out
}

// theilSen is the median of the slopes between every two points.
func theilSen(ts, ys []float64) float64 {
	var slopes []float64
	for i := range ts {
		for j := i + 1; j < len(ts); j++ {
			if ts[j] != ts[i] {
				slopes = append(slopes, (ys[j]-ys[i])/(ts[j]-ts[i]))
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	return median(slopes)
}

// median sorts xs and returns their median.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// recordsCheck is what the database held at the end against what the soak
// expects of it.
type recordsCheck struct {
	total, ballastMissing        int
	expected, lost, wrong, stale []string
	staleChecked, pendingRemoval int
	unexpected                   []string
	err                          error
}

// check runs the end-of-run checks and judges the targets.
func (e *env) check(tenants []*tenant, res *soakResult) *report {
	ctx := context.Background()
	rep := &report{res: res}
	rep.flat = flatness(res.samples, e.o.warmup, e.o.tolerance)
	if err := e.waitReady(ctx); err != nil {
		logf("the runtime does not answer through the proxy: %v", err)
	}

	// Leaks: the e2e tests' assertions, over every private image on the
	// node, for a pod without credentials and for the other private
	// tenant's pod (which holds grants of its own).
	rep.leaks = append(rep.leaks, res.leaks...)
	var private []*tenant
	for _, t := range tenants {
		if t.private {
			private = append(private, t)
		}
	}
	for i, t := range private {
		other := private[(i+1)%len(private)]
		p, err := e.podWithGrants(ctx, other)
		if err != nil {
			e.counters.fail("leak check: the other tenant's pod", err)
		}
		held, _ := e.heldBy(ctx, t)
		logf("leak check: %d images of %s on the node, against a pod without credentials and %s's pod", len(held), t.name, other.name)
		rep.leaks = append(rep.leaks, e.leakCheck(ctx, t, 0, p)...)
		if p != nil {
			e.removePod(ctx, p)
		}
	}

	rep.records = e.checkRecords(ctx, tenants)
	rep.panics = e.panics()

	m := e.metricsBy("cri_image_proxy_config_reloads_total", "result")
	applied, refused := m["applied"], m["refused"]

	// The targets.
	add := func(desc string, met bool, why string) {
		rep.targets = append(rep.targets, target{desc, met, why})
		if !met {
			rep.missed = append(rep.missed, desc+": "+why)
		}
	}
	for _, f := range rep.flat {
		if !f.asserted {
			continue
		}
		if f.n < 3 {
			add(fmt.Sprintf("%s flat within %.0f%% after the warm-up", f.name, 100*e.o.tolerance), false,
				fmt.Sprintf("%d samples after the warm-up: too few to tell", f.n))
			continue
		}
		add(fmt.Sprintf("%s flat within %.0f%% after the warm-up", f.name, 100*e.o.tolerance), f.ok,
			fmt.Sprintf("drift %+.2f%s over %v (%.2f%% of the mean %.1f; range %.1f-%.1f)", f.drift, f.unit,
				time.Duration((f.t1-f.t0)*float64(time.Second)).Round(time.Second), 100*f.rel*sign(f.drift), f.mean, f.min, f.max))
	}
	if last := res.samples[len(res.samples)-1]; !math.IsNaN(last.dbMiB) && !math.IsNaN(last.dataMiB) {
		bound := 2*last.dataMiB + 16
		add("database size bounded by what it holds (<= 2 x its pages in use + 16 MiB)", last.dbMiB <= bound,
			fmt.Sprintf("%.1f MiB file, %.1f MiB of pages in use: bound %.1f MiB", last.dbMiB, last.dataMiB, bound))
	} else {
		add("database size bounded by what it holds", false, "the last sample could not read the database")
	}
	rc := rep.records
	if rc.err != nil {
		add("no record lost", false, rc.err.Error())
	} else {
		add("no record lost", rc.ballastMissing == 0 && len(rc.lost) == 0 && len(rc.wrong) == 0,
			fmt.Sprintf("%d records; of the %d prefilled %d missing; %d expected of images on the node: %d missing, %d without the pull's credential",
				rc.total, len(e.ballast), rc.ballastMissing, len(rc.expected), len(rc.lost), len(rc.wrong)))
		add("no record left of an image removed (through the proxy, or longer than the grace period and two clean-ups ago)", len(rc.stale) == 0,
			fmt.Sprintf("%d removed images checked, %d with a record left; %d removed around the proxy more recently (not checked)",
				rc.staleChecked, len(rc.stale), rc.pendingRemoval))
	}
	add("no image leaked to a pod not verified for it", len(rep.leaks) == 0,
		fmt.Sprintf("%d leak checks during the run and one over every private image at the end; %d findings", e.counters.leakChecks.Load(), len(rep.leaks)))
	add("no panic", len(rep.panics) == 0 && e.proxy.Alive(),
		fmt.Sprintf("proxy %d alive: %v; %d panic or fatal lines in its log", e.proxyPid(), e.proxy.Alive(), len(rep.panics)))
	add("every reload applied", refused == 0 && applied >= float64(e.counters.reloads.Load()),
		fmt.Sprintf("%d SIGHUPs sent; the proxy counted %.0f reloads applied, %.0f refused", e.counters.reloads.Load(), applied, refused))

	pulledOnce, fresh := 0, 0
	for _, t := range tenants {
		for _, st := range t.states {
			if st.pulls > 0 || st.onNode {
				pulledOnce++
			}
			fresh += st.fresh
		}
	}
	rep.cycled = fmt.Sprintf("%d of %d images pulled at least once; %d pulls to the registry (the image not on the node), %d images removed (%d through the proxy, %d directly)",
		pulledOnce, e.o.images, fresh, e.counters.removedProxy.Load()+e.counters.removedDirect.Load(), e.counters.removedProxy.Load(), e.counters.removedDirect.Load())
	if e.o.duration >= 30*time.Minute {
		add(fmt.Sprintf("at least %d images cycled through the node", e.o.images), pulledOnce == e.o.images && fresh >= e.o.images, rep.cycled)
	}
	rep.markdown = e.markdown(rep)
	return rep
}

func sign(x float64) float64 {
	if x < 0 {
		return -1
	}
	return 1
}

// podWithGrants starts a pod of t and has it re-use one of t's images (a
// grant of its own), as its pods did all run long.
func (e *env) podWithGrants(ctx context.Context, t *tenant) (*pod, error) {
	p, err := e.newPod(ctx, t.name, t.name+"-final")
	if err != nil {
		return nil, err
	}
	held, err := e.heldBy(ctx, t)
	if err != nil || len(held) == 0 {
		return p, err
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	images := runtimeapi.NewImageServiceClient(e.proxied)
	images.ImageStatus(cctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: held[0].name}})
	_, err = images.PullImage(cctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: held[0].name}, Auth: t.auth, SandboxConfig: p.config})
	return p, err
}

// checkRecords reads every record through the admin socket (once: 100,000
// records are tens of MiB of JSON) and holds them against what the soak
// expects.
func (e *env) checkRecords(ctx context.Context, tenants []*tenant) recordsCheck {
	var rc recordsCheck
	c, err := admin.Dial(e.admin)
	if err != nil {
		rc.err = err
		return rc
	}
	list, err := c.List(ctx)
	if err != nil {
		rc.err = fmt.Errorf("records list: %w", err)
		return rc
	}
	now := time.Now()
	rc.total = len(list.Records)
	byRef := map[string]int{}
	for i, r := range list.Records {
		byRef[r.ImageRef] = i
	}
	known := map[string]bool{}
	for _, ref := range e.ballast {
		known[ref] = true
		if _, ok := byRef[ref]; !ok {
			rc.ballastMissing++
		}
	}
	// What the node holds now, asked directly.
	onNode := map[string]bool{}
	for _, t := range tenants {
		held, err := e.heldBy(ctx, t)
		if err != nil {
			rc.err = err
			return rc
		}
		for _, h := range held {
			onNode[h.id] = true
		}
	}
	settled := e.o.gracePeriod + 2*e.o.gcInterval
	for _, t := range tenants {
		for i, st := range t.states {
			img := t.images[i]
			if st.id == "" {
				continue
			}
			known[st.id] = true
			idx, has := byRef[st.id]
			switch {
			case st.known && st.onNode:
				rc.expected = append(rc.expected, img.name)
				if !has {
					rc.lost = append(rc.lost, fmt.Sprintf("%s (%s)", img.name, st.id))
					continue
				}
				creds, ok := list.Records[idx].CredentialMapping[img.repo]
				if !ok || (t.private && (len(creds.KubernetesSecrets) == 0 || creds.NodePodsAccessible)) || (!t.private && !creds.NodePodsAccessible) {
					rc.wrong = append(rc.wrong, fmt.Sprintf("%s: %+v", img.name, list.Records[idx].CredentialMapping))
				}
			case st.known && !st.onNode && !st.removedAt.IsZero() && !onNode[st.id]:
				if !st.viaProxy && now.Sub(st.removedAt) < settled {
					rc.pendingRemoval++
					continue
				}
				rc.staleChecked++
				if has {
					how := "through the proxy"
					if !st.viaProxy {
						how = "around it"
					}
					rc.stale = append(rc.stale, fmt.Sprintf("%s, removed %s %v ago", img.name, how, now.Sub(st.removedAt).Round(time.Second)))
				}
			}
		}
	}
	for _, r := range list.Records {
		if !known[r.ImageRef] {
			rc.unexpected = append(rc.unexpected, r.ImageRef)
		}
	}
	return rc
}

// panics returns the lines of the proxy's log that tell of a panic or a
// fatal error (a recovered panic is logged too).
func (e *env) panics() []string {
	b, err := os.ReadFile(e.proxy.Log)
	if err != nil {
		return []string{"reading the proxy's log: " + err.Error()}
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(strings.ToLower(l), "panic") || strings.Contains(l, "fatal error:") {
			out = append(out, l)
		}
	}
	return out
}
