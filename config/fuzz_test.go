package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the decoder: it must return an error
// or a configuration, never panic, and what it returns must validate
// without panicking.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"full.yaml", "minimal.yaml"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\nsocket: {path: 1}\n"))
	f.Add([]byte("{\"apiVersion\":\"config.cri-image-proxy.io/v1alpha1\",\"kind\":\"ProxyConfiguration\",\"shutdownTimeout\":\"-1s\"}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			return
		}
		_ = c.Validate()
	})
}
