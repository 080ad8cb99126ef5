package registry

import "sync"

// maxLabelledHosts bounds the registry hosts (and endpoints) the metrics
// name: a pod names any host it likes, and each would add series.
const maxLabelledHosts = 64

// otherHost is the label of every host past the bound, and of hosts no
// check has verified anything at.
const otherHost = "other"

// labelSet decides which registry hosts and endpoints the metrics name.
// A host earns its own label when a check there verified a credential (a
// registry that answers as one), or when the operator named it (a
// vouched mirror's registry, docker.io); up to a bound, past which, as
// before the first verification, it is "other". So the series stay
// bounded whatever hosts pods name, and the registries a node really uses
// are told apart. Safe for concurrent use.
type labelSet struct {
	mu      sync.RWMutex
	max     int
	fixed   map[string]bool
	earned  map[string]bool
	endings map[string]bool // endpoint labels earned
}

func newLabelSet(max int) *labelSet {
	return &labelSet{max: max, fixed: map[string]bool{"docker.io": true}, earned: map[string]bool{}, endings: map[string]bool{}}
}

// setFixed makes hosts labelled whatever the checks found (the vouched
// mirrors' registries, at each reload).
func (l *labelSet) setFixed(hosts []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fixed = map[string]bool{"docker.io": true}
	for _, h := range hosts {
		l.fixed[h] = true
	}
}

// earn labels registry and the endpoint of ep from now on, within the bound.
func (l *labelSet) earn(registry string, ep *endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.fixed[registry] && !l.earned[registry] && len(l.earned) < l.max {
		l.earned[registry] = true
	}
	if ep != nil && !l.endings[ep.label()] && len(l.endings) < l.max+len(l.fixed) {
		l.endings[ep.label()] = true
	}
}

// registry is a registry host's label.
func (l *labelSet) registry(host string) string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.fixed[host] || l.earned[host] {
		return host
	}
	return otherHost
}

// endpoint is an endpoint's label: "" for none asked.
func (l *labelSet) endpoint(ep *endpoint) string {
	if ep == nil {
		return ""
	}
	lab := ep.label()
	l.mu.RLock()
	defer l.mu.RUnlock()
	if ep.vouched || l.endings[lab] {
		return lab
	}
	return otherHost
}
