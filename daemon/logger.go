package daemon

import (
	"io"
	"log/slog"
	"slices"

	"k8s.io/klog/v2"

	"github.com/cri-image-proxy/cri-image-proxy/config"
)

// newLogger returns the daemon's logger, writing to w, and sends
// client-go's klog output through it too: one format (JSON mode is all
// JSON), one level filter.
func newLogger(l config.Logging, w io.Writer) *slog.Logger {
	level, _ := l.SlogLevel() // validated
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if l.Format == "json" {
		log = slog.New(slog.NewJSONHandler(w, opts))
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	klog.SetSlogLogger(log)
	return log
}

// logDeprecations warns of each deprecated field the configuration sets.
func logDeprecations(log *slog.Logger, deprecations []config.Deprecation) {
	for _, d := range deprecations {
		log.Warn("a deprecated configuration field is set; it is still read", "field", d.Field, "use", d.Use)
	}
}

// newDeprecations are the deprecated fields next sets that old did not:
// those a reload warns of (old's were warned of when it was applied).
func newDeprecations(old, next *config.ProxyConfiguration) []config.Deprecation {
	var out []config.Deprecation
	for _, d := range next.Deprecations() {
		if !slices.Contains(old.Deprecations(), d) {
			out = append(out, d)
		}
	}
	return out
}
