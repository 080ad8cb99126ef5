package authcache

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/utils/clock"
)

// KeyType is how widely a cached answer applies, as a plugin's response
// says (cacheKeyType).
type KeyType string

// The key types of KEP-2133.
const (
	Image    KeyType = "Image"
	Registry KeyType = "Registry"
	Global   KeyType = "Global"
)

// globalKey is the base key of Global entries. It cannot collide with an
// image or registry name, which never contain '<'.
const globalKey = "<global>"

// DefaultMaxEntries bounds a cache when Options.MaxEntries is 0.
const DefaultMaxEntries = 4096

// Options configure a Cache.
type Options struct {
	// MaxEntries bounds the number of entries; 0 means DefaultMaxEntries.
	MaxEntries int
	// Clock is the time source; nil means the real clock.
	Clock clock.PassiveClock
	// OnEvict is called, without locks held, with the number of entries
	// dropped because the cache was full (not because they expired).
	OnEvict func(n int)
}

// Cache maps (key type, image, extra) to a value of type V with an expiry.
type Cache[V any] struct {
	clock   clock.PassiveClock
	max     int
	onEvict func(int)

	mu      sync.Mutex
	entries map[string]entry[V]

	group singleflight.Group
}

type entry[V any] struct {
	value     V
	expiresAt time.Time
}

// New returns an empty cache.
func New[V any](opts Options) *Cache[V] {
	c := &Cache[V]{clock: opts.Clock, max: opts.MaxEntries, onEvict: opts.OnEvict, entries: make(map[string]entry[V])}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if c.max <= 0 {
		c.max = DefaultMaxEntries
	}
	return c
}

// RegistryOf returns the registry part of an image repository: everything
// before the first '/', port included, as the kubelet computes it.
func RegistryOf(image string) string {
	registry, _, _ := strings.Cut(image, "/")
	return registry
}

// key builds the unambiguous key of a base key and an extra part: each
// length-prefixed, so ("ab", "c") and ("a", "bc") differ.
func key(base, extra string) string {
	b := make([]byte, 0, 8+len(base)+len(extra))
	b = binary.BigEndian.AppendUint32(b, uint32(len(base)))
	b = append(b, base...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(extra)))
	b = append(b, extra...)
	return string(b)
}

// baseKey is the base key an entry of type t for image is stored under.
func baseKey(t KeyType, image string) (string, error) {
	switch t {
	case Image:
		return image, nil
	case Registry:
		return RegistryOf(image), nil
	case Global:
		return globalKey, nil
	}
	return "", fmt.Errorf("cache key type %q is not Image, Registry or Global", t)
}

// lookupOrder is the kubelet's: the most specific key first.
var lookupOrder = [...]KeyType{Image, Registry, Global}

// Get returns the value cached for image (with extra, the service-account
// part; empty for plain plugins), looking up the image, registry and global
// keys in that order.
func (c *Cache[V]) Get(image, extra string) (V, KeyType, bool) {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range lookupOrder {
		base, _ := baseKey(t, image)
		k := key(base, extra)
		e, ok := c.entries[k]
		if !ok {
			continue
		}
		if !now.Before(e.expiresAt) {
			delete(c.entries, k)
			continue
		}
		return e.value, t, true
	}
	var zero V
	return zero, "", false
}

// Put stores v for ttl under the key of type t for image and extra. A ttl
// of zero or less stores nothing.
func (c *Cache[V]) Put(t KeyType, image, extra string, v V, ttl time.Duration) error {
	base, err := baseKey(t, image)
	if err != nil {
		return err
	}
	if ttl <= 0 {
		return nil
	}
	now := c.clock.Now()
	k := key(base, extra)
	c.mu.Lock()
	evicted := 0
	if _, exists := c.entries[k]; !exists && len(c.entries) >= c.max {
		evicted = c.makeRoomLocked(now)
	}
	c.entries[k] = entry[V]{value: v, expiresAt: now.Add(ttl)}
	c.mu.Unlock()
	if evicted > 0 && c.onEvict != nil {
		c.onEvict(evicted)
	}
	return nil
}

// makeRoomLocked frees at least one place: all expired entries, or else the
// one expiring soonest. It returns how many live entries it evicted.
func (c *Cache[V]) makeRoomLocked(now time.Time) int {
	if c.purgeLocked(now) > 0 {
		return 0
	}
	var victim string
	var soonest time.Time
	for k, e := range c.entries {
		if victim == "" || e.expiresAt.Before(soonest) {
			victim, soonest = k, e.expiresAt
		}
	}
	delete(c.entries, victim)
	return 1
}

func (c *Cache[V]) purgeLocked(now time.Time) int {
	n := 0
	for k, e := range c.entries {
		if !now.Before(e.expiresAt) {
			delete(c.entries, k)
			n++
		}
	}
	return n
}

// Purge drops expired entries and returns how many.
func (c *Cache[V]) Purge() int {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.purgeLocked(now)
}

// Clear drops every entry and returns how many there were.
func (c *Cache[V]) Clear() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.entries)
	clear(c.entries)
	return n
}

// Len returns the number of entries, expired ones included.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Do runs fetch once for all concurrent callers with the same flight key
// and gives each the result; shared reports whether it was shared.
func (c *Cache[V]) Do(flightKey string, fetch func() (any, error)) (v any, err error, shared bool) {
	return c.group.Do(flightKey, fetch)
}

// FlightKey builds a singleflight key from parts, unambiguously.
func FlightKey(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return string(b)
}
