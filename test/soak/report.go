package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// write puts the CSV, the plot, the summary and the proxy's log in -out.
func (e *env) write(rep *report) error {
	if err := os.MkdirAll(e.o.out, 0o755); err != nil {
		return err
	}
	var csv strings.Builder
	csv.WriteString("minutes")
	for _, sr := range series {
		name := strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(sr.name)
		if sr.unit != "" {
			name += "_" + sr.unit
		}
		csv.WriteString("," + name)
	}
	csv.WriteString(",steps,pulls,runtime_restarts,reloads\n")
	for _, s := range rep.res.samples {
		fmt.Fprintf(&csv, "%.2f", s.at.Minutes())
		for _, sr := range series {
			v := sr.get(s)
			if math.IsNaN(v) {
				csv.WriteString(",")
			} else {
				fmt.Fprintf(&csv, ",%.3f", v)
			}
		}
		fmt.Fprintf(&csv, ",%d,%d,%d,%d\n", s.steps, s.pulls, s.restarts, s.reloads)
	}
	if err := os.WriteFile(filepath.Join(e.o.out, "soak.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.o.out, "soak.md"), []byte(rep.markdown), 0o644); err != nil {
		return err
	}
	if err := copyFile(e.proxy.Log, filepath.Join(e.o.out, "proxy.log")); err != nil {
		return err
	}
	return drawPlot(filepath.Join(e.o.out, "soak.svg"), filepath.Join(e.o.out, "soak.png"), rep.res.samples, rep.flat, e.o.warmup.Minutes(), e.o.tolerance)
}

// markdown is the summary an operator reads.
func (e *env) markdown(rep *report) string {
	var b strings.Builder
	res := rep.res
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "# Soak of cri-image-proxy\n\n")
	fmt.Fprintf(&b, "%s, %v of load on %s (%s), sampled every %v, warm-up %v, tolerance %.0f%%. Load average at the end: %s.\n\n",
		res.began.Format(time.RFC3339), res.ended.Sub(res.began).Round(time.Second), e.rig.Runtime.Name, hostname(),
		e.o.interval, e.o.warmup, 100*e.o.tolerance, strings.TrimSpace(string(load)))
	if len(e.o.adjusted) > 0 {
		fmt.Fprintf(&b, "A short run: %s. Its figures are indicative.\n\n", strings.Join(e.o.adjusted, "; "))
	}
	fmt.Fprintf(&b, "Proxy: ensure on, %d records prefilled, gcInterval %v, gracePeriod %v, credential provider for %s; SIGHUP every %v, runtime restarted every %v.\n\n",
		e.o.records, e.o.gcInterval, e.o.gracePeriod, pluginRegistry, e.o.reloadEvery, e.o.restartEvery)

	fmt.Fprintf(&b, "## Targets\n\n")
	met := 0
	for _, t := range rep.targets {
		mark := "MISSED"
		if t.met {
			mark, met = "met", met+1
		}
		fmt.Fprintf(&b, "- **%s** %s: %s\n", mark, t.desc, t.why)
	}
	fmt.Fprintf(&b, "\n%d of %d targets met.\n\n", met, len(rep.targets))

	fmt.Fprintf(&b, "## Series\n\n")
	fmt.Fprintf(&b, "Flat: after the warm-up, the Theil-Sen slope (the median of the slopes between every two samples) times the time the samples span, against their mean.\n\n")
	fmt.Fprintf(&b, "| series | start | after warm-up | end | min-max after warm-up | mean | drift | |\n|---|---|---|---|---|---|---|---|\n")
	for _, f := range rep.flat {
		verdict := ""
		if f.asserted && f.n >= 3 {
			verdict = "flat"
			if !f.ok {
				verdict = "**not flat**"
			}
		} else if !f.asserted {
			verdict = "(shown)"
		}
		name := f.name
		if f.unit != "" {
			name += " (" + f.unit + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s-%s | %s | %+.2f%% | %s |\n", name, num(f.first), num(f.warm), num(f.last),
			num(f.min), num(f.max), num(f.mean), 100*f.rel*sign(f.drift), verdict)
	}

	c := &e.counters
	fmt.Fprintf(&b, "\n## Load\n\n")
	fmt.Fprintf(&b, "- %d steps, %d pulls through the proxy (%d verified re-uses answered from the node or re-pulls of an image on it), %d containers created, %d pods\n",
		c.steps.Load(), c.pulls.Load(), c.reuses.Load(), c.containers.Load(), c.pods.Load())
	fmt.Fprintf(&b, "- %s\n", rep.cycled)
	fmt.Fprintf(&b, "- %d reloads (SIGHUP), %d runtime restarts, %d leak checks\n", c.reloads.Load(), c.restarts.Load(), c.leakChecks.Load())
	if errs := c.errorSummary(); len(errs) > 0 {
		fmt.Fprintf(&b, "- failed calls (the runtime restarts make some; each was counted, and the image's state left unknown):\n")
		for _, s := range errs {
			fmt.Fprintf(&b, "  - %s\n", s)
		}
	}
	rc := rep.records
	fmt.Fprintf(&b, "\n## Records at the end\n\n")
	fmt.Fprintf(&b, "- %d records: %d prefilled (%d missing), %d expected of images on the node, %d removed images checked for a record left\n",
		rc.total, len(e.ballast), rc.ballastMissing, len(rc.expected), rc.staleChecked)
	list := func(title string, xs []string) {
		if len(xs) == 0 {
			return
		}
		fmt.Fprintf(&b, "- %s (%d):\n", title, len(xs))
		for i, x := range xs {
			if i == 20 {
				fmt.Fprintf(&b, "  - ... and %d more\n", len(xs)-20)
				break
			}
			fmt.Fprintf(&b, "  - %s\n", x)
		}
	}
	list("lost: an image on the node, pulled through the proxy, without its record", rc.lost)
	list("a record without the pull's credential", rc.wrong)
	list("a record left of a removed image", rc.stale)
	list("records of images the soak did not pull (tracked by the proxy: arrived images, cut pulls)", rc.unexpected)
	list("leaks", rep.leaks)
	list("panic lines in the proxy's log", rep.panics)
	fmt.Fprintf(&b, "\n## Files\n\n- plot: %s (and %s)\n- samples: %s\n- the proxy's log: %s\n",
		filepath.Join(e.o.out, "soak.svg"), filepath.Join(e.o.out, "soak.png"), filepath.Join(e.o.out, "soak.csv"), filepath.Join(e.o.out, "proxy.log"))
	return b.String()
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
