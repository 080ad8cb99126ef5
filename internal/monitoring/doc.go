// Package monitoring serves the daemon's HTTP endpoint for operators, off
// the CRI socket: /metrics (Prometheus), /healthz (the process answers) and
// /readyz (the container runtime behind the proxy answers too, within two
// seconds), and, only when asked, Go's pprof handlers.
//
// cri_image_proxy_backend_up is checked at scrape time, so it is never
// stale. Nothing served here carries a credential.
package monitoring
