package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// call is one request of a load arm.
type call func(ctx context.Context) error

// timedCall is a call that times itself, for arms whose calls need some
// untimed preparation (the ImageStatus before a PullImage).
type timedCall func(ctx context.Context) (time.Duration, error)

// timed adapts a call that times itself to a call: the time it reports
// replaces the measured one (see runSegment).
func timed(f timedCall) call {
	return func(ctx context.Context) error {
		d, err := f(ctx)
		if rec, ok := ctx.Value(durationKey{}).(*time.Duration); ok {
			*rec = d
		}
		return err
	}
}

type durationKey struct{}

// segment is one timed run of an arm.
type segment struct {
	calls    int
	errors   int
	lat      []time.Duration
	wall     time.Duration
	cpu      map[string]time.Duration // per watched process: CPU used during the segment
	firstErr error
}

// runSegment runs f from conc goroutines for d and measures it. watch names
// the processes whose CPU is read around the segment (pid 0 is the bench).
func runSegment(f call, conc int, d time.Duration, watch map[string]int) segment {
	ctx := context.Background()
	var mu sync.Mutex
	seg := segment{cpu: map[string]time.Duration{}}
	before := map[string]time.Duration{}
	for name, pid := range watch {
		before[name] = processCPU(pid)
	}
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var errs int
			var first error
			var reported time.Duration
			cctx := context.WithValue(ctx, durationKey{}, &reported)
			for time.Now().Before(stop) {
				reported = -1
				t := time.Now()
				err := f(cctx)
				d := time.Since(t)
				if reported >= 0 {
					d = reported
				}
				lat = append(lat, d)
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
				}
			}
			mu.Lock()
			seg.lat = append(seg.lat, lat...)
			seg.errors += errs
			if seg.firstErr == nil {
				seg.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	seg.wall = time.Since(start)
	for name, pid := range watch {
		seg.cpu[name] = processCPU(pid) - before[name]
	}
	seg.calls = len(seg.lat)
	sort.Slice(seg.lat, func(i, j int) bool { return seg.lat[i] < seg.lat[j] })
	return seg
}

func (s segment) quantile(q float64) time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	return s.lat[int(q*float64(len(s.lat)-1))]
}

func (s segment) rate() float64 { return float64(s.calls) / s.wall.Seconds() }

// cpuPerCall is the CPU the named processes used per call.
func (s segment) cpuPerCall(names ...string) time.Duration {
	var sum time.Duration
	for _, n := range names {
		sum += s.cpu[n]
	}
	if s.calls == 0 {
		return 0
	}
	return sum / time.Duration(s.calls)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
