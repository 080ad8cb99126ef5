package podtoken

// Internals for the external tests (package podtoken_test), which drive a
// Source through podtokentest and client-go's fake clientset.

// DropExpired runs the periodic cleanup now.
func (s *Source) DropExpired() { s.dropExpired() }

// CachedTokens is how many tokens the Source holds.
func (s *Source) CachedTokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tokens)
}
