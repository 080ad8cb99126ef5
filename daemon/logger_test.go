package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/cri-image-proxy/cri-image-proxy/config"
)

// TestClientGoLogsThroughTheDaemonsHandler: what client-go logs (through
// klog) comes out in the daemon's format, JSON included, and its level
// filter applies.
func TestClientGoLogsThroughTheDaemonsHandler(t *testing.T) {
	var buf bytes.Buffer
	newLogger(config.Logging{Level: "info", Format: "json"}, &buf)
	defer klog.ClearLogger()
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "reflector", "pods")
	klog.V(4).InfoS("a detail below the level")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line, got %d:\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("klog's line is not JSON: %v\n%s", err, lines[0])
	}
	if rec["msg"] != "Failed to watch" || rec["level"] != "ERROR" || rec["reflector"] != "pods" {
		t.Errorf("klog's line: %v", rec)
	}
}
