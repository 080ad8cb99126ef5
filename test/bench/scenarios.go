package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// arm is one way of making a call in a scenario.
type arm struct {
	name string
	call call
	// cpu names the processes whose CPU is this arm's cost: containerd for
	// the direct arm, the proxy for the proxied arm (its own share only),
	// and for the bare arm the bare server plus the bench (the client): one
	// gRPC transaction, the floor.
	cpu []string
}

// target is a pass/fail check on a scenario's result.
type target struct {
	desc  string
	value func(*result) float64 // a ratio
	max   float64               // the value must be <= max ...
	min   float64               // ... and >= min (0: no minimum)
}

// scenario is a measurement of arms side by side (scenarioOf).
type scenario struct {
	name    string // set by scenarioOf
	conc    int
	arms    []arm // arms[0] is the baseline of the ratios
	targets []target
	long    bool                 // slow calls: longer segments
	before  func()               // runs before the scenario, when set
	notes   func(*result) string // a line for the report, when set
}

func versionCall(cc *grpc.ClientConn) call {
	c := runtimeapi.NewRuntimeServiceClient(cc)
	return func(ctx context.Context) error {
		_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}
}

func imageStatusCall(cc *grpc.ClientConn, image string) call {
	c := runtimeapi.NewImageServiceClient(cc)
	req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	return func(ctx context.Context) error {
		r, err := c.ImageStatus(ctx, req)
		if err == nil && r.Image == nil {
			err = fmt.Errorf("image %s not present", image)
		}
		return err
	}
}

func listImagesCall(cc *grpc.ClientConn, want int) call {
	c := runtimeapi.NewImageServiceClient(cc)
	return func(ctx context.Context) error {
		r, err := c.ListImages(ctx, &runtimeapi.ListImagesRequest{})
		if err == nil && len(r.Images) < want {
			err = fmt.Errorf("listed %d images, want at least %d", len(r.Images), want)
		}
		return err
	}
}

// proxyOverFloor is the proxy's CPU per proxied call over the CPU of one
// bare gRPC transaction (server + client), per round, median.
func proxyOverFloor(proxied, bare int) func(*result) float64 {
	return func(r *result) float64 {
		var xs []float64
		for _, round := range r.rounds {
			floor := round[bare].cpuPerCall(r.sc.arms[bare].cpu...)
			if floor > 0 {
				xs = append(xs, float64(round[proxied].cpuPerCall("proxy"))/float64(floor))
			}
		}
		return median(xs)
	}
}

func p50Ratio(armIdx int) func(*result) float64 {
	return func(r *result) float64 { return r.p50Ratio(armIdx) }
}

// The arms of the pass-through scenarios, and their target: the proxy's
// CPU per call next to one bare gRPC transaction.
func directArm(c call) arm  { return arm{name: "direct", call: c, cpu: []string{"containerd"}} }
func proxiedArm(c call) arm { return arm{name: "proxied", call: c, cpu: []string{"proxy"}} }
func bareArm(c call) arm {
	return arm{name: "bare gRPC (floor)", call: c, cpu: []string{"bare", "bench"}}
}

var floorTarget = target{desc: "proxy CPU per pass-through call <= 1.1x a bare gRPC server+client call", value: proxyOverFloor(1, 2), max: 1.1}

// passThroughScenarios: small calls through the proxy, against containerd
// directly and a bare gRPC server.
func passThroughScenarios() []measurement {
	var out []measurement
	for _, conc := range []int{1, 64} {
		out = append(out, scenarioOf(fmt.Sprintf("Version c=%d", conc), nil, func(e *benchEnv) scenario {
			return scenario{
				conc:    conc,
				arms:    []arm{directArm(versionCall(e.direct)), proxiedArm(versionCall(e.proxied)), bareArm(versionCall(e.bare1))},
				targets: []target{floorTarget},
			}
		}))
	}
	for _, conc := range []int{1, 64} {
		out = append(out, scenarioOf(fmt.Sprintf("ImageStatus c=%d", conc), nil, func(e *benchEnv) scenario {
			return scenario{
				conc: conc,
				arms: []arm{
					directArm(imageStatusCall(e.direct, e.presentImage)),
					proxiedArm(imageStatusCall(e.proxied, e.presentImage)),
					bareArm(imageStatusCall(e.bare1, e.presentImage)),
				},
				targets: []target{floorTarget},
			}
		}))
	}
	return out
}

// listImagesScenario: a large answer through the proxy.
var listImagesScenario = scenarioOf("ListImages(1000) c=1", nil, func(e *benchEnv) scenario {
	return scenario{
		conc: 1, long: true,
		arms:    []arm{directArm(listImagesCall(e.direct, 1000)), proxiedArm(listImagesCall(e.proxied, 1000))},
		targets: []target{{desc: "ListImages(1000) p50 through the proxy <= 1.15x direct", value: p50Ratio(1), max: 1.15}},
	}
})

// result holds every segment of a scenario: rounds[i][arm].
type result struct {
	sc          scenario
	rounds      [][]segment
	warmupCalls []int // per arm
}

// segmentLength is how long one arm runs in a round.
func (e *benchEnv) segmentLength(sc scenario) time.Duration {
	d := time.Duration(e.opts.seconds * float64(time.Second))
	if sc.conc == 1 {
		d = d * 3 / 2 // fewer calls per second: a longer segment for stable quantiles
	}
	if sc.long {
		d *= 2 // slow calls (a large ListImages, pulls): more of them per segment
	}
	return d
}

// duration is how long measure takes for sc, warm-up included.
func (e *benchEnv) duration(sc scenario) time.Duration {
	d := e.segmentLength(sc)
	return time.Duration(len(sc.arms)) * (d/4 + time.Duration(e.opts.rounds)*d)
}

// measure runs the scenario's rounds, rotating the order of the arms.
func (e *benchEnv) measure(sc scenario) *result {
	d := e.segmentLength(sc)
	r := &result{sc: sc}
	if sc.before != nil {
		sc.before()
	}
	// One warm-up segment per arm, not recorded.
	for _, a := range sc.arms {
		r.warmupCalls = append(r.warmupCalls, runSegment(a.call, sc.conc, d/4, e.pids).calls)
	}
	for i := 0; i < e.opts.rounds; i++ {
		round := make([]segment, len(sc.arms))
		for k := range sc.arms {
			j := (i + k) % len(sc.arms)
			round[j] = runSegment(sc.arms[j].call, sc.conc, d, e.pids)
			if round[j].errors > 0 {
				e.logf("  %s/%s: %d errors, first: %v", sc.name, sc.arms[j].name, round[j].errors, round[j].firstErr)
			}
		}
		r.rounds = append(r.rounds, round)
	}
	return r
}

func (r *result) perRound(f func(round []segment) float64) float64 {
	var xs []float64
	for _, round := range r.rounds {
		xs = append(xs, f(round))
	}
	return median(xs)
}

func (r *result) p50Ratio(a int) float64 {
	return r.perRound(func(s []segment) float64 { return float64(s[a].quantile(0.5)) / float64(s[0].quantile(0.5)) })
}

// p50Delta is the median over rounds of arm a's p50 minus the baseline's.
func (r *result) p50Delta(a int) time.Duration {
	return time.Duration(r.perRound(func(s []segment) float64 { return float64(s[a].quantile(0.5) - s[0].quantile(0.5)) }))
}

// ratioOf is the p50 ratio of arm a over arm b, per round, median.
func ratioOf(a, b int) func(*result) float64 {
	return func(r *result) float64 {
		return r.perRound(func(s []segment) float64 { return float64(s[a].quantile(0.5)) / float64(s[b].quantile(0.5)) })
	}
}

func (r *result) p99Ratio(a int) float64 {
	return r.perRound(func(s []segment) float64 { return float64(s[a].quantile(0.99)) / float64(s[0].quantile(0.99)) })
}

func (r *result) rateRatio(a int) float64 {
	return r.perRound(func(s []segment) float64 { return s[a].rate() / s[0].rate() })
}

func (r *result) armMedian(a int, f func(segment) float64) float64 {
	return r.perRound(func(s []segment) float64 { return f(s[a]) })
}
