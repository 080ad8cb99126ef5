// Package imagepolicytest holds an image policy for tests of the code that
// asks one (ensure's guard, image policy's own CRI hooks): it decides from
// what the test told it, records what it was asked, and runs no plugin.
package imagepolicytest
