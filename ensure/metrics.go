package ensure

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of a must-verify check, with the kubelet's names
// (kubelet_imagemanager_image_mustpull_checks_total).
const (
	resultPolicyAllowed = "credentialPolicyAllowed"
	resultRecordFound   = "credentialRecordFound"
	resultMustAuth      = "mustAuthenticate"
	resultError         = "error"
)

type metrics struct {
	checks    *prometheus.CounterVec // result
	hidden    prometheus.Counter
	reuses    prometheus.Counter
	pulls     *prometheus.CounterVec // result
	denials   prometheus.Counter
	recordErr prometheus.Counter
	arrivals  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, counts func() (int, int), grants func() int, available, writable, observed func() bool) (*metrics, error) {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "cri_image_proxy", Subsystem: "ensure", Name: name, Help: help}
	}
	m := &metrics{
		checks:    prometheus.NewCounterVec(opts("mustpull_checks_total", "Decisions whether a present image needs credential verification, by result (the kubelet's names: credentialPolicyAllowed, credentialRecordFound, mustAuthenticate, error)."), []string{"result"}),
		hidden:    prometheus.NewCounter(opts("hidden_images_total", "ImageStatus calls answered \"not present\" because the image needs verification.")),
		reuses:    prometheus.NewCounter(opts("fastpath_reuses_total", "PullImage calls answered from the node: the credential was already verified for the image.")),
		pulls:     prometheus.NewCounterVec(opts("verification_pulls_total", "PullImage calls forwarded to the runtime (the registry checks the credential), by result."), []string{"result"}),
		denials:   prometheus.NewCounter(opts("createcontainer_denials_total", "CreateContainer calls refused: the image needs verification and the pod has none.")),
		recordErr: prometheus.NewCounter(opts("record_write_errors_total", "Pulls whose intent (the pull is then refused) or record (the intent stays: the image needs verification) could not be written.")),
		arrivals:  prometheus.NewCounter(opts("arrived_images_total", "Images found with no record that hold a layer private on the node since before the proxy first saw them (pulled around the proxy, or left by a refused pull): tracked as pulled with no verified credential.")),
	}
	if reg == nil {
		return m, nil
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cri_image_proxy", Subsystem: "ensure", Name: name, Help: help}, f)
	}
	for _, c := range []prometheus.Collector{
		m.checks, m.hidden, m.reuses, m.pulls, m.denials, m.recordErr, m.arrivals,
		gauge("ondisk_pulledrecords", "Image records in the database.", func() float64 { r, _ := counts(); return float64(r) }),
		gauge("ondisk_pullintents", "Pull intents in the database (pulls in flight, or left by a crash until the next start).", func() float64 { _, i := counts(); return float64(i) }),
		gauge("pod_grants", "Images granted to pods, in memory.", func() float64 { return float64(grants()) }),
		gauge("records_available", "1 when the records database is open; 0 when it could not be opened at start: every image that needs verification is then refused until it is fixed and the proxy restarted (see the log).", boolGauge(available)),
		gauge("records_writable", "1 while the records database takes writes; 0 from a write that failed (a full or read-only filesystem: pulls are refused, or their images need verification by every pod) until one succeeds again.", boolGauge(writable)),
		gauge("node_observed", "1 once a look at the node's images has succeeded; 0 until then (the runtime not answering at start): no image counts as preloaded and no layer as public meanwhile.", boolGauge(observed)),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// boolGauge is 1 when f says so, else 0.
func boolGauge(f func() bool) func() float64 {
	return func() float64 {
		if f() {
			return 1
		}
		return 0
	}
}
