package main

import (
	"fmt"
	"strings"
	"time"
)

// extraTarget is a target measured outside the scenarios.
type extraTarget struct {
	desc       string
	value, max float64
}

// render writes the results as markdown tables.
func render(results []*result, extra []extraTarget, about string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# cri-image-proxy benchmark\n\n%s\n\n", about)
	b.WriteString("Medians over rounds. Ratios are taken within a round against the first arm, then the median is reported. ")
	b.WriteString("CPU is the arm's own process(es): containerd (direct), the proxy process alone (proxied), bare server + client (floor).\n\n")
	b.WriteString("| scenario | arm | p50 µs | p99 µs | calls/s | p50 ratio | p99 ratio | tput ratio | CPU µs/call |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for a, arm := range r.sc.arms {
			p50 := time.Duration(r.armMedian(a, func(s segment) float64 { return float64(s.quantile(0.5)) }))
			p99 := time.Duration(r.armMedian(a, func(s segment) float64 { return float64(s.quantile(0.99)) }))
			rate := r.armMedian(a, func(s segment) float64 { return s.rate() })
			cpu := time.Duration(r.armMedian(a, func(s segment) float64 { return float64(s.cpuPerCall(arm.cpu...)) }))
			name := r.sc.name
			if a > 0 {
				name = ""
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %.2f | %.2f | %.2f | %s |\n",
				name, arm.name, us(p50), us(p99), rate, r.p50Ratio(a), r.p99Ratio(a), r.rateRatio(a), usf(cpu))
		}
	}
	for _, r := range results {
		if r.sc.notes != nil {
			fmt.Fprintf(&b, "\n%s: %s\n", r.sc.name, r.sc.notes(r))
		}
	}
	b.WriteString("\n## Targets\n\n| scenario | target | measured | result |\n|---|---|---|---|\n")
	for _, r := range results {
		for _, t := range r.sc.targets {
			v := t.value(r)
			fmt.Fprintf(&b, "| %s | %s | %.3f | %s |\n", r.sc.name, t.desc, v, passFail(t, v))
		}
	}
	for _, x := range extra {
		fmt.Fprintf(&b, "| after the scenarios | %s | %.3g | %s |\n", x.desc, x.value, passFail(target{max: x.max}, x.value))
	}
	return b.String()
}

func usf(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)) }

func passFail(t target, v float64) string {
	if (t.max > 0 && v > t.max) || (t.min > 0 && v < t.min) {
		return "**MISSED**"
	}
	return "met"
}

func failedTargets(results []*result, extra []extraTarget) []string {
	var out []string
	for _, x := range extra {
		if x.value > x.max {
			out = append(out, fmt.Sprintf("%s: measured %.3g", x.desc, x.value))
		}
	}
	for _, r := range results {
		for _, t := range r.sc.targets {
			if v := t.value(r); passFail(t, v) != "met" {
				out = append(out, fmt.Sprintf("%s: %s: measured %.3f", r.sc.name, t.desc, v))
			}
		}
	}
	return out
}
