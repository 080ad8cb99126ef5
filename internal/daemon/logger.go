package daemon

import (
	"io"
	"log/slog"

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
