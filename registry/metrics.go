package registry

import "github.com/prometheus/client_golang/prometheus"

// metrics are labelled by the registry host the image names and the
// endpoint asked, scheme and host only (the registry's server or a vouched
// mirror: one per registry), both bounded (labelSet: hosts no check
// verified anything at, and those past the bound, are "other"), never by a
// repository, an endpoint's path or anything of a credential.
type metrics struct {
	checks   *prometheus.CounterVec   // registry, endpoint, result
	blobs    *prometheus.CounterVec   // registry, endpoint, result
	requests *prometheus.HistogramVec // registry, endpoint
	proofs   *prometheus.CounterVec   // registry, endpoint, result
}

// Results of a check, as the checks metric labels them. A forged answer
// (ErrForged) is a refusal too, counted apart: a registry serving bytes
// that are not the content it names is news for the operator (a tenant
// naming an image it does not hold, or a corrupt storage), which a
// credential refused is not.
const (
	resultVerified    = "verified"
	resultDenied      = "denied"
	resultForged      = "forged"
	resultMoved       = "moved"
	resultUnreachable = "unreachable"
	resultInvalid     = "invalid"
)

// Results of a blob a check asked for, as the blobs metric labels them.
const (
	blobPresent = "present"
	blobMissing = "missing"
	blobRefused = "refused"
	blobForged  = "forged" // the config's bytes (GET) are not the config
	blobError   = "error"
)

// Results of a layer proof, as the proofs metric labels them: proven
// counts layers, the others proofs (each stops at its first failure).
const (
	proofProven    = "proven"
	proofForged    = "forged"     // a layer's bytes are not its blob, or not its diff_id
	proofOverBound = "over_bound" // stopped at a bound: compressed, decompressed, a zstd window
	proofFailed    = "failed"     // anything else: a layer missing, refused, unreachable
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "registry", Name: "checks_total",
			Help: "Checks at an image's registry (or a vouched mirror) of a credential for an image, by registry host, endpoint asked (\"\" when none was) and result (verified, denied, forged, moved, unreachable, invalid).",
		}, []string{"registry", "endpoint", "result"}),
		blobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "registry", Name: "blob_checks_total",
			Help: "Blobs (and manifests by digest) a check asked the repository for (the config by GET, the rest by HEAD), by registry host, endpoint and result (present, missing, refused, forged, error).",
		}, []string{"registry", "endpoint", "result"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cri_image_proxy", Subsystem: "registry", Name: "request_duration_seconds",
			Help:    "Time to the response headers of each HTTP request of a check (token requests and redirects included), by registry host and endpoint.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"registry", "endpoint"}),
		proofs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "registry", Name: "layer_proofs_total",
			Help: "Layers a check proved by fetching their bytes (content the node shares by digest that this repository had not supplied), by registry host, endpoint and result (proven: layers; forged, over_bound, failed: proofs that failed).",
		}, []string{"registry", "endpoint", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.checks, m.blobs, m.requests, m.proofs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
