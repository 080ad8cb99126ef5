// Package monitoring ships the Prometheus alert rules (alerts.yaml) and the
// Grafana dashboard (dashboard.json) of cri-image-proxy, and lists the
// PromQL queries they hold (Queries) so that tests can hold them to the
// metrics the daemon exports: this package's tests against the metrics
// table of docs/operations.md, parsing with Prometheus's own rule and
// PromQL parsers; the end-to-end tests against a running daemon's
// /metrics.
//
// Nothing here is linked into the daemon. Prometheus's server module, which
// the tests use, must stay out of the daemon's imports; a test checks it.
package monitoring
