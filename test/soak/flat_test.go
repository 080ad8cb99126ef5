package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// samplesOf makes one sample a minute with RSS f(minute).
func samplesOf(n int, f func(m int) float64) []sample {
	var out []sample
	for m := range n {
		out = append(out, sample{at: time.Duration(m) * time.Minute, rssMiB: f(m)})
	}
	return out
}

func rssFlat(t *testing.T, samples []sample) flatResult {
	t.Helper()
	for _, f := range flatness(samples, 5*time.Minute, 0.05) {
		if f.name == "RSS" {
			return f
		}
	}
	t.Fatal("no RSS series")
	return flatResult{}
}

func TestFlatness(t *testing.T) {
	t.Run("a steady series with a start-up climb is flat", func(t *testing.T) {
		f := rssFlat(t, samplesOf(30, func(m int) float64 {
			if m < 5 {
				return 20 + 4*float64(m) // the warm-up: not held to it
			}
			return 40 + float64(m%3) // noise of ±1 around 41
		}))
		if !f.ok || f.n != 25 {
			t.Errorf("%+v", f)
		}
	})
	t.Run("a leak of 0.3% a minute over 25 minutes is not", func(t *testing.T) {
		f := rssFlat(t, samplesOf(30, func(m int) float64 { return 40 * (1 + 0.003*float64(m)) }))
		if f.ok || math.Abs(f.rel-2.88/42.04) > 0.001 {
			t.Errorf("drift %.4f of the mean: %+v", f.rel, f)
		}
		f = rssFlat(t, samplesOf(60, func(m int) float64 { return 40 * (1 + 0.003*float64(m)) }))
		if f.ok {
			t.Errorf("a longer run of the same leak passed: %+v", f)
		}
	})
	t.Run("a few spikes (a runtime restart) do not move the slope", func(t *testing.T) {
		f := rssFlat(t, samplesOf(30, func(m int) float64 {
			if m == 10 || m == 20 || m == 29 {
				return 80
			}
			return 40
		}))
		if !f.ok || f.slope != 0 {
			t.Errorf("%+v", f)
		}
	})
	t.Run("too few samples are not judged", func(t *testing.T) {
		if f := rssFlat(t, samplesOf(6, func(int) float64 { return 1 })); f.ok || f.n != 1 {
			t.Errorf("%+v", f)
		}
	})
	t.Run("missing figures are left out", func(t *testing.T) {
		f := rssFlat(t, samplesOf(20, func(m int) float64 {
			if m%4 == 0 {
				return math.NaN()
			}
			return 10
		}))
		if !f.ok || f.n != 12 || f.mean != 10 {
			t.Errorf("%+v", f)
		}
	})
}

func TestDrawPlot(t *testing.T) {
	samples := samplesOf(30, func(m int) float64 { return 40 + float64(m%3) })
	for i := range samples {
		samples[i].goroutines, samples[i].dbMiB = 100, math.NaN()
	}
	dir := t.TempDir()
	if d := os.Getenv("SOAK_PLOT_DIR"); d != "" {
		dir = d // to look at it
	}
	svg, png := filepath.Join(dir, "soak.svg"), filepath.Join(dir, "soak.png")
	if err := drawPlot(svg, png, samples, flatness(samples, 5*time.Minute, 0.05), 5, 0.05); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{svg, png} {
		if fi, err := os.Stat(p); err != nil || fi.Size() < 1000 {
			t.Errorf("%s: %v", p, err)
		}
	}
}
