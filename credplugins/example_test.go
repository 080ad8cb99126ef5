package credplugins

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDeployedExampleLoads(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "docker-config-credential-provider"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(filepath.Join("..", "deploy", "examples", "credential-providers.yaml"), bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Providers) != 1 {
		t.Errorf("providers: %+v", cfg.Providers)
	}
}
