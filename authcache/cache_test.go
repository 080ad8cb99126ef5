package authcache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestGetLooksUpImageThenRegistryThenGlobal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		puts     map[KeyType]string // key type -> value, stored for "reg.io:5000/team/app"
		image    string
		want     string
		wantType KeyType
		found    bool
	}{
		{"an image entry answers for that image only", map[KeyType]string{Image: "i"}, "reg.io:5000/team/app", "i", Image, true},
		{"an image entry does not answer for another image", map[KeyType]string{Image: "i"}, "reg.io:5000/team/other", "", "", false},
		{"a registry entry answers for every image of the registry", map[KeyType]string{Registry: "r"}, "reg.io:5000/other/x", "r", Registry, true},
		{"a registry entry keeps its port", map[KeyType]string{Registry: "r"}, "reg.io/team/app", "", "", false},
		{"a global entry answers for any image", map[KeyType]string{Global: "g"}, "elsewhere.io/x", "g", Global, true},
		{"the image entry wins over registry and global", map[KeyType]string{Image: "i", Registry: "r", Global: "g"}, "reg.io:5000/team/app", "i", Image, true},
		{"the registry entry wins over global", map[KeyType]string{Registry: "r", Global: "g"}, "reg.io:5000/team/app", "r", Registry, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New[string](Options{Clock: testclock.NewFakeClock(t0)})
			for kt, v := range tc.puts {
				if err := c.Put(kt, "reg.io:5000/team/app", "", v, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			got, gotType, found := c.Get(tc.image, "")
			if got != tc.want || gotType != tc.wantType || found != tc.found {
				t.Errorf("Get(%q) = %q, %q, %v; want %q, %q, %v", tc.image, got, gotType, found, tc.want, tc.wantType, tc.found)
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	clk := testclock.NewFakeClock(t0)
	c := New[string](Options{Clock: clk})

	t.Run("a zero TTL stores nothing", func(t *testing.T) {
		c.Put(Image, "r.io/a", "", "v", 0)
		if _, _, ok := c.Get("r.io/a", ""); ok || c.Len() != 0 {
			t.Errorf("a zero TTL was cached")
		}
	})
	t.Run("an entry lives until its TTL and not a moment longer", func(t *testing.T) {
		c.Put(Image, "r.io/b", "", "v", 10*time.Second)
		clk.Step(10*time.Second - time.Nanosecond)
		if _, _, ok := c.Get("r.io/b", ""); !ok {
			t.Fatalf("gone before its TTL")
		}
		clk.Step(time.Nanosecond)
		if _, _, ok := c.Get("r.io/b", ""); ok {
			t.Fatalf("still there at its TTL")
		}
		if c.Len() != 0 {
			t.Errorf("an expired entry read was not dropped")
		}
	})
	t.Run("Purge drops expired entries nobody reads", func(t *testing.T) {
		c.Put(Registry, "r.io/c", "", "old", time.Second)
		c.Put(Image, "r.io/d", "", "young", time.Hour)
		clk.Step(2 * time.Second)
		if n := c.Purge(); n != 1 {
			t.Errorf("purged %d, want 1", n)
		}
		if _, _, ok := c.Get("r.io/d", ""); !ok {
			t.Errorf("a live entry was purged")
		}
	})
}

func TestExtraKeyPartSeparatesEntries(t *testing.T) {
	t.Parallel()
	c := New[string](Options{Clock: testclock.NewFakeClock(t0)})
	c.Put(Registry, "r.io/a", "sa-1", "one", time.Minute)
	c.Put(Registry, "r.io/a", "sa-2", "two", time.Minute)
	for extra, want := range map[string]string{"sa-1": "one", "sa-2": "two"} {
		if got, _, ok := c.Get("r.io/a", extra); !ok || got != want {
			t.Errorf("Get(extra %q) = %q, %v; want %q", extra, got, ok, want)
		}
	}
	if _, _, ok := c.Get("r.io/a", ""); ok {
		t.Errorf("an entry with an extra part answered a lookup without one")
	}
	// Length prefixes: "ab"+"c" and "a"+"bc" are different keys.
	if key("ab", "c") == key("a", "bc") {
		t.Errorf("keys are ambiguous")
	}
}

func TestSizeBound(t *testing.T) {
	t.Parallel()
	clk := testclock.NewFakeClock(t0)
	var evicted atomic.Int64
	c := New[string](Options{Clock: clk, MaxEntries: 3, OnEvict: func(n int) { evicted.Add(int64(n)) }})
	for i, ttl := range []time.Duration{time.Hour, time.Minute, 2 * time.Hour} {
		c.Put(Image, fmt.Sprintf("r.io/%d", i), "", "v", ttl)
	}
	t.Run("a full cache evicts the entry expiring soonest", func(t *testing.T) {
		c.Put(Image, "r.io/new", "", "v", time.Hour)
		if c.Len() != 3 {
			t.Fatalf("len %d, want 3", c.Len())
		}
		if _, _, ok := c.Get("r.io/1", ""); ok {
			t.Errorf("the entry expiring soonest survived")
		}
		if evicted.Load() != 1 {
			t.Errorf("evictions reported %d, want 1", evicted.Load())
		}
	})
	t.Run("expired entries make room before live ones are evicted", func(t *testing.T) {
		clk.Step(90 * time.Minute) // r.io/0 and r.io/new expire
		c.Put(Image, "r.io/later", "", "v", time.Hour)
		if _, _, ok := c.Get("r.io/2", ""); !ok {
			t.Errorf("a live entry was evicted while expired ones remained")
		}
		if evicted.Load() != 1 {
			t.Errorf("purging expired entries was counted as eviction")
		}
	})
	t.Run("replacing an existing key evicts nothing", func(t *testing.T) {
		before := c.Len()
		c.Put(Image, "r.io/later", "", "v2", time.Hour)
		if c.Len() != before || evicted.Load() != 1 {
			t.Errorf("len %d -> %d, evictions %d", before, c.Len(), evicted.Load())
		}
	})
}

func TestDoRunsOneFetchForConcurrentCallers(t *testing.T) {
	t.Parallel()
	c := New[string](Options{})
	var fetches atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	var started sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			started.Done()
			v, err, _ := c.Do(FlightKey("r.io/app"), func() (any, error) {
				fetches.Add(1)
				<-release
				return "creds", nil
			})
			if err != nil || v != "creds" {
				t.Errorf("Do = %v, %v", v, err)
			}
		}()
	}
	started.Wait()
	time.Sleep(50 * time.Millisecond) // let the callers pile up on the flight
	close(release)
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 64 concurrent callers, want 1", n)
	}
}

func TestUnknownKeyTypeIsAnError(t *testing.T) {
	t.Parallel()
	c := New[string](Options{})
	if err := c.Put("Repository", "r.io/a", "", "v", time.Minute); err == nil {
		t.Errorf("an unknown key type was accepted")
	}
}

func BenchmarkGetHit(b *testing.B) {
	c := New[string](Options{Clock: testclock.NewFakeClock(t0)})
	c.Put(Registry, "registry.test:5000/team/app", "", "v", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := c.Get("registry.test:5000/team/app", ""); !ok {
			b.Fatal("miss")
		}
	}
}

func TestClearDropsEveryEntry(t *testing.T) {
	t.Parallel()
	c := New[string](Options{Clock: testclock.NewFakeClock(t0)})
	for _, kt := range []KeyType{Image, Registry, Global} {
		if err := c.Put(kt, "reg.io/team/app", "", string(kt), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Clear(); n != 3 || c.Len() != 0 {
		t.Errorf("Clear() = %d, Len() = %d after; want 3, 0", n, c.Len())
	}
	if _, _, found := c.Get("reg.io/team/app", ""); found {
		t.Error("an entry survived Clear")
	}
}
