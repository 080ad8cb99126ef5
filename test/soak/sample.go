package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	bolt "go.etcd.io/bbolt"
)

// sample is one look at the proxy. A figure that could not be read is NaN.
type sample struct {
	at time.Duration // since the load began
	// The asserted series.
	rssMiB, goroutines, fds, dbMiB, records, layers float64
	// For the plot and the bound: the Go heap in use, intents, pod
	// grants, distinct layers known, the bytes the database's pages hold.
	heapMiB, heapGoalMiB, intents, grants, diffIDs, dataMiB float64
	// What the load had done by then.
	steps, pulls, errors, restarts, reloads int64
}

// series names the figures of a sample, in the CSV's and the plot's order.
var series = []struct {
	name, unit string
	asserted   bool
	get        func(s sample) float64
}{
	{"RSS", "MiB", true, func(s sample) float64 { return s.rssMiB }},
	{"goroutines", "", true, func(s sample) float64 { return s.goroutines }},
	{"open descriptors", "", true, func(s sample) float64 { return s.fds }},
	{"database size", "MiB", true, func(s sample) float64 { return s.dbMiB }},
	{"records", "", true, func(s sample) float64 { return s.records }},
	{"layers known (images)", "", true, func(s sample) float64 { return s.layers }},
	{"Go heap in use", "MiB", false, func(s sample) float64 { return s.heapMiB }},
	// The heap's goal, set at the end of each collection (live heap ×
	// (1+GOGC/100)): a smoother view of the live heap than in-use.
	{"Go heap goal (next GC)", "MiB", false, func(s sample) float64 { return s.heapGoalMiB }},
	{"database pages in use", "MiB", false, func(s sample) float64 { return s.dataMiB }},
	{"distinct layers known", "", false, func(s sample) float64 { return s.diffIDs }},
	{"pull intents", "", false, func(s sample) float64 { return s.intents }},
	{"pod grants", "", false, func(s sample) float64 { return s.grants }},
	{"failed calls (cumulative)", "", false, func(s sample) float64 { return float64(s.errors) }},
}

func (s sample) brief() string {
	return fmt.Sprintf("RSS %.1f MiB, %.0f goroutines, %.0f fds, db %.1f MiB (pages %.1f), %.0f records, %.0f images' layers, %.0f intents, %.0f grants; %d steps, %d pulls, %d failed calls",
		s.rssMiB, s.goroutines, s.fds, s.dbMiB, s.dataMiB, s.records, s.layers, s.intents, s.grants, s.steps, s.pulls, s.errors)
}

// sample reads the proxy's /proc, its /metrics and a copy of its database.
func (e *env) sample(began time.Time) sample {
	nan := math.NaN()
	s := sample{at: time.Since(began), rssMiB: nan, goroutines: nan, fds: nan, dbMiB: nan, records: nan, layers: nan,
		heapMiB: nan, heapGoalMiB: nan, intents: nan, grants: nan, diffIDs: nan, dataMiB: nan}
	s.steps, s.pulls = e.counters.steps.Load(), e.counters.pulls.Load()
	s.errors, s.restarts, s.reloads = int64(e.counters.errorCount()), e.counters.restarts.Load(), e.counters.reloads.Load()
	if kb, ok := procStatus(e.proxyPid(), "VmRSS"); ok {
		s.rssMiB = kb / 1024
	}
	if m, err := e.scrape(); err != nil {
		logf("scraping the proxy's metrics: %v", err)
	} else {
		s.goroutines = m["go_goroutines"]
		s.fds = m["process_open_fds"]
		s.records = m["cri_image_proxy_ensure_ondisk_pulledrecords"]
		s.intents = m["cri_image_proxy_ensure_ondisk_pullintents"]
		s.grants = m["cri_image_proxy_ensure_pod_grants"]
		s.heapMiB = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
		s.heapGoalMiB = m["go_memstats_next_gc_bytes"] / (1 << 20)
	}
	if fi, err := os.Stat(e.db); err == nil {
		s.dbMiB = float64(fi.Size()) / (1 << 20)
	}
	if c, err := e.countDatabase(); err != nil {
		logf("counting the database's copy: %v", err)
	} else {
		s.layers, s.diffIDs, s.dataMiB = float64(c.layers), float64(c.diffIDs), float64(c.dataBytes)/(1<<20)
	}
	return s
}

// procStatus is a field of /proc/PID/status, in kB.
func procStatus(pid int, field string) (float64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			n, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n, err == nil
		}
	}
	return 0, false
}

// scrape reads the proxy's /metrics: the value of each unlabelled gauge
// or counter, and the sum over the labels of the others.
func (e *env) scrape() (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.metrics+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			out[name] += metricValue(m)
		}
	}
	return out, nil
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// metricsBy is one metric of the proxy's /metrics by the value of label.
func (e *env) metricsBy(name, label string) map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.metrics+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil || fams[name] == nil {
		return nil
	}
	out := map[string]float64{}
	for _, m := range fams[name].Metric {
		for _, l := range m.Label {
			if l.GetName() == label {
				out[l.GetValue()] += metricValue(m)
			}
		}
	}
	return out
}

// dbCounts is what a copy of the database holds.
type dbCounts struct {
	layers    int            // images whose layers it knows (the layers bucket)
	diffIDs   int            // distinct layers among them
	dataBytes int64          // bytes of the pages its buckets take
	keys      map[string]int // keys of each bucket of the schema
}

// countDatabase copies the database file (the daemon holds its lock) and
// counts what the copy holds. bbolt writes a transaction's pages before the
// meta page that points at them, and reuses a page only once no committed
// meta points at it: the copy reads as the transaction its meta pages name,
// unless the copy took as long as two commits. A copy that does not read
// is taken again.
func (e *env) countDatabase() (dbCounts, error) {
	var c dbCounts
	copyPath := filepath.Join(e.work, "ensure-copy.db")
	defer os.Remove(copyPath)
	var err error
	for try := 0; try < 3; try++ {
		if err = copyFile(e.db, copyPath); err != nil {
			continue
		}
		if c, err = countCopy(copyPath); err == nil {
			return c, nil
		}
	}
	return c, err
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func countCopy(path string) (c dbCounts, err error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return c, err
	}
	defer db.Close()
	// A torn copy may fault inside bbolt: retried by the caller.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the copy: %v", r)
		}
	}()
	err = db.View(func(tx *bolt.Tx) error {
		root := tx.Bucket([]byte("v1"))
		if root == nil {
			return fmt.Errorf("no v1 bucket")
		}
		st := root.Stats()
		c.dataBytes = int64(st.BranchAlloc + st.LeafAlloc)
		c.keys = map[string]int{}
		if err := root.ForEachBucket(func(k []byte) error {
			c.keys[string(k)] = root.Bucket(k).Stats().KeyN
			return nil
		}); err != nil {
			return err
		}
		layers := root.Bucket([]byte("layers"))
		if layers == nil {
			return nil
		}
		diffIDs := map[string]bool{}
		return layers.ForEach(func(k, v []byte) error {
			c.layers++
			if len(v) > 8 {
				for _, d := range strings.Split(string(v[8:]), "\n") {
					diffIDs[d] = true
				}
			}
			c.diffIDs = len(diffIDs)
			return nil
		})
	})
	return c, err
}
