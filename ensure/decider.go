package ensure

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Decider is the enforcer's core: what the records, the policy, the
// runtime and the pulls in flight say of an image, with no CRI types and
// no state of its own beyond what it reads. The Guard is a Decider plus
// the CRI path's state (grants, hides, the pods of the node, metrics);
// records explain, with no daemon running, uses a Decider alone.
type Decider struct {
	store RecordStore
	// policy is swapped whole by SetPolicy (a reload); a decision reads it
	// once.
	policy atomic.Pointer[policyRef]
	// expiry (optional) bounds the re-use of verified credentials; swapped
	// whole by SetExpiry.
	expiry  atomic.Pointer[expiryRef]
	now     func() time.Time
	runtime Runtime
	// pending counts pulls in flight per repository, intents a crash left
	// included: their images are never taken for preloaded ones.
	pending *pendingTable
	// unrecorded are images pulled through the proxy whose record could
	// not be written: until a restart settles their intents, they count as
	// pulled with no verified credential (see PullImage).
	unrecorded *pendingTable
	log        *slog.Logger
	// names remembers parsed image names.
	names imageref.Names
}

// policyRef boxes a Policy for atomic.Pointer.
type policyRef struct{ Policy }

// Policy returns the policy decisions are made under now.
func (d *Decider) Policy() Policy { return d.policy.Load().Policy }

// SetPolicy makes p the policy of the next decisions (a reload of the
// configuration); decisions already under way finish under the old one.
func (d *Decider) SetPolicy(p Policy) { d.policy.Store(&policyRef{p}) }

// NewDecider returns the core over store, policy and rt, for decisions
// outside the daemon (records explain): the intents on disk count as pulls
// in flight, as they do in a daemon that has not settled them yet.
func NewDecider(store RecordStore, policy Policy, rt Runtime) (*Decider, error) {
	d := &Decider{}
	if _, err := d.init(store, policy, rt, nil); err != nil {
		return nil, err
	}
	return d, nil
}

// init sets d up and returns the intents found on disk, each counted as a
// pull in flight of its repository.
func (d *Decider) init(store RecordStore, policy Policy, rt Runtime, log *slog.Logger) ([]Intent, error) {
	d.store, d.runtime, d.log = store, rt, log
	d.SetPolicy(policy)
	if d.now == nil {
		d.now = time.Now
	}
	d.pending, d.unrecorded = newPendingTable(), newPendingTable()
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	leftover, err := store.Intents()
	if err != nil {
		return nil, fmt.Errorf("reading pull intents: %w", err)
	}
	for _, in := range leftover {
		if repo, ok := imageref.Repository(in.Image); ok {
			d.pending.inc(repo)
		}
	}
	return leftover, nil
}
