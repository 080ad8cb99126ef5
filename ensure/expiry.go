package ensure

import (
	"fmt"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// expiryRef boxes an *Expiry for atomic.Pointer.
type expiryRef struct{ *decision.Expiry }

// Expiry returns the record expiry decisions are made under now.
func (d *Decider) Expiry() *decision.Expiry {
	if r := d.expiry.Load(); r != nil {
		return r.Expiry
	}
	return nil
}

// SetExpiry makes e the record expiry of the next decisions (a reload of
// the configuration; NewGuard and NewDecider take the first); nil is none.
func (d *Decider) SetExpiry(e *decision.Expiry) { d.expiry.Store(&expiryRef{e}) }

// fresh reports whether one of a credential's keys (records.CredentialKeys)
// was verified for imageRef as repo within repo's maximum age; always
// with no maximum. With one, a credential with no time, or a time that
// cannot be read, is not fresh. why says what expired.
func (d *Decider) fresh(imageRef, repo string, keys ...string) (ok bool, why string) {
	max := d.Expiry().MaxAge(repo)
	if max <= 0 {
		return true, ""
	}
	now := d.now()
	future := false
	for _, k := range keys {
		t, found, err := d.store.VerifiedAt(imageRef, repo, k)
		switch {
		case err != nil || !found:
		case t.After(now):
			// A clock that ran ahead and was corrected: the time says nothing
			// of how old the verification is, so it is not fresh.
			future = true
		case now.Sub(t) <= max:
			return true, ""
		}
	}
	if future {
		if d.futureLogged.CompareAndSwap(false, true) {
			d.log.Warn("a record has a verification time in the future; its credentials are verified again",
				"imageRef", imageRef, "repository", repo, "now", now, "remedy", "check whether the node's clock was set back")
		}
		return false, fmt.Sprintf("verified at a time in the future for %s: it must be verified again", repo)
	}
	return false, fmt.Sprintf("verified more than the maximum record age (%s) ago for %s, or before the age was kept: it must be verified again", max, repo)
}
