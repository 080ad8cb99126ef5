// Package testkit holds the test helpers that the tests of several
// packages share, written once: an executable plugin script (WritePlugin),
// a registry a tenant runs for itself, one that serves only what the
// test put, honest or lying about the blobs it holds (Registry), and the
// metrics a collector describes, as a test pins them (MetricDescriptions).
//
// It is for tests only: it is imported from _test.go files, never from
// product code (TestOnlyTestsImportTestkit checks the tree), so no test
// double reaches a binary. The fake CRI runtime is its package fakecri;
// the real components the end-to-end tests, the bench and the demo start
// are package rig's.
package testkit
