// Package ensuretest holds what tests of package ensure share: the
// conformance suite every RecordStore must pass (the bbolt Store and the
// in-memory fake both run it), and that fake.
package ensuretest
