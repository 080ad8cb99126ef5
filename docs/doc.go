// Package docs is the project's documentation (the Markdown files beside
// this one) and the tests that hold it to the code, so that it cannot
// drift: architecture_test.go checks the layers drawn in architecture.md
// (every package on its folder's layer, with a line saying its role; no
// folder importing one on its own layer or above) and its import map
// (each package's non-test imports of this module, exactly) against
// `go list ./...`. It has no code of its own and nothing imports it.
package docs
