package imagepolicytest

import (
	"context"
	"sync"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
)

// Policy requires a signature in some namespaces, as a cosign policy
// would: there it allows a manifest digest it was told is signed, and an
// image ID a verdict was bound to for that namespace; every other
// namespace is allowed with no provider's decision. It satisfies the
// policy interfaces of imagepolicy/cri and ensure, and is safe for
// concurrent use.
type Policy struct {
	mu         sync.Mutex
	namespaces map[string]bool // namespaces with a policy
	signed     map[string]bool // signed manifest digests
	bound      map[string]bool // image ID + "/" + namespace
	asked      []imagepolicy.Subject
}

// NewPolicy returns a policy that applies in namespaces.
func NewPolicy(namespaces ...string) *Policy {
	p := &Policy{namespaces: map[string]bool{}, signed: map[string]bool{}, bound: map[string]bool{}}
	for _, ns := range namespaces {
		p.namespaces[ns] = true
	}
	return p
}

// Sign makes the image of a manifest digest signed.
func (p *Policy) Sign(manifestDigest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signed[manifestDigest] = true
}

func (p *Policy) Decide(_ context.Context, s imagepolicy.Subject) (imagepolicy.Verdict, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, s)
	ns := s.Pod.Namespace
	switch {
	case !p.namespaces[ns]:
		return imagepolicy.Verdict{Allowed: true, Namespace: ns}, nil
	case p.bound[s.ImageID+"/"+ns] || p.signed[s.Digest]:
		return imagepolicy.Verdict{Allowed: true, Namespace: ns, Decisions: []imagepolicy.Decision{{Provider: "fake", Allowed: true}}}, nil
	}
	return imagepolicy.Verdict{Namespace: ns, PodReason: "image is not signed"}, nil
}

func (p *Policy) Bind(v imagepolicy.Verdict, imageID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v.Allowed && len(v.Decisions) > 0 {
		p.bound[imageID+"/"+v.Namespace] = true
	}
}

// IsBound reports whether an allowing verdict was bound to imageID in
// namespace.
func (p *Policy) IsBound(imageID, namespace string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bound[imageID+"/"+namespace]
}

func (p *Policy) Applies(namespace, _ string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.namespaces[namespace]
}

func (p *Policy) NoMatchPolicy(string) imagepolicy.NoMatchPolicy { return imagepolicy.NoMatchAllow }

// Subjects returns what the policy was asked since the last call.
func (p *Policy) Subjects() []imagepolicy.Subject {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.asked
	p.asked = nil
	return out
}
