package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// runCLI runs the command line args and returns its output and error.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCmd()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	goodDB := filepath.Join(dir, "good.db")
	s, err := records.Open(goodDB, records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	badDB := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(badDB, bytes.Repeat([]byte("not a database\n"), 500), 0o600); err != nil {
		t.Fatal(err)
	}
	testdata, err := filepath.Abs("../../credplugins/testdata")
	if err != nil {
		t.Fatal(err)
	}
	pluginConfig := filepath.Join(testdata, "config", "v1.yaml")
	plugins := []string{"--image-credential-provider-config", pluginConfig, "--image-credential-provider-bin-dir", filepath.Join(testdata, "bin")}

	tests := []struct {
		name     string
		args     []string
		wantErr  bool
		wantLine string
	}{
		{"defaults alone are valid", nil, false, "ok    configuration"},
		{"the plugins and their executables are checked", plugins, false, "ok    credential providers " + pluginConfig + " (1 provider(s)"},
		{"a plugin executable that is missing is an error naming it", []string{"--image-credential-provider-config", pluginConfig, "--image-credential-provider-bin-dir", dir}, true, "FAIL  credential providers"},
		{"a kubeconfig that does not exist is an error", []string{"--kubeconfig", filepath.Join(dir, "none")}, true, "FAIL  kubeconfig " + filepath.Join(dir, "none")},
		{"an unknown policy is an error of the configuration", []string{"--ensure-secret-pulled-images", "--image-pull-credentials-verification-policy", "Sometimes"}, true, ""},
		{"a database that opens is ok", []string{"--ensure-secret-pulled-images", "--ensure-database", goodDB}, false, "ok    records database " + goodDB},
		{"an absent database is ok: serve creates it", []string{"--ensure-secret-pulled-images", "--ensure-database", filepath.Join(dir, "new.db")}, false, "(absent: serve creates it)"},
		{"a database that cannot be opened is a warning: serve would run, failing closed", []string{"--ensure-secret-pulled-images", "--ensure-database", badDB}, false, "warn  records database " + badDB},
		{"with --strict it is an error", []string{"--ensure-secret-pulled-images", "--ensure-database", badDB, "--strict"}, true, "FAIL  records database " + badDB},
		{"an admin group that exists is ok", []string{"--ensure-secret-pulled-images", "--ensure-database", goodDB, "--admin-group", "0"}, false, "ok    admin group 0"},
		{"an admin group that does not exist is an error naming the field", []string{"--ensure-secret-pulled-images", "--ensure-database", goodDB, "--admin-group", "no-such-group-for-cri-image-proxy"}, true, "FAIL  admin group no-such-group-for-cri-image-proxy: ensureSecretPulledImages.adminGroup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runCLI(t, append([]string{"config", "validate"}, tt.args...)...)
			if (err != nil) != tt.wantErr || !strings.Contains(out, tt.wantLine) {
				t.Errorf("config validate %v: err %v, want error %v; output:\n%s", tt.args, err, tt.wantErr, out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "new.db")); !os.IsNotExist(err) {
		t.Errorf("config validate created the absent database (%v)", err)
	}
}

func TestConfigDumpIsWhatServeRunsAndLoadsBack(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: "+config.APIVersion+"\nkind: "+config.Kind+"\nsocket:\n  path: /run/x/x.sock\nlogging:\n  level: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", file, "--log-level", "warn", "--ensure-secret-pulled-images"}
	out, err := runCLI(t, append([]string{"config", "dump"}, args...)...)
	if err != nil {
		t.Fatalf("config dump: %v\n%s", err, out)
	}
	dumped, err := config.Decode([]byte(out))
	if err != nil {
		t.Fatalf("the dump does not load back: %v\n%s", err, out)
	}
	serveCmd := newServeCmd()
	if err := serveCmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	want, err := loadServeConfig(serveCmd.Flags(), file)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dumped, want) {
		t.Errorf("dumped %+v\nserve runs %+v", dumped, want)
	}
	if dumped.Socket.Path != "/run/x/x.sock" || dumped.Logging.Level != "warn" {
		t.Errorf("the dump lost the file's socket or the flag's log level:\n%s", out)
	}
}

// TestConfigCommandsOnTheDeprecatedRegistryFields: validate warns of a
// deprecated field, naming its successor, and refuses the two set apart;
// dump prints the file with the current fields only.
func TestConfigCommandsOnTheDeprecatedRegistryFields(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	head := "apiVersion: " + config.APIVersion + "\nkind: " + config.Kind + "\n"
	old := filepath.Join(dir, "old.yaml")
	if err := os.WriteFile(old, []byte(head+"ensureSecretPulledImages:\n  registryHostsDir: /etc/node/certs.d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	both := filepath.Join(dir, "both.yaml")
	if err := os.WriteFile(both, []byte(head+"ensureSecretPulledImages:\n  registryHostsDir: /etc/node/certs.d\nregistryCheck:\n  hostsDir: /etc/other/certs.d\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runCLI(t, "config", "validate", "--config", old)
	if err != nil || !strings.Contains(out, "warn  ensureSecretPulledImages.registryHostsDir is deprecated: use registryCheck.hostsDir") || !strings.Contains(out, "valid") {
		t.Errorf("config validate of the deprecated field: %v\n%s", err, out)
	}
	out, err = runCLI(t, "config", "validate", "--config", both)
	if err == nil || !strings.Contains(err.Error(), "ensureSecretPulledImages.registryHostsDir") || !strings.Contains(err.Error(), "registryCheck.hostsDir") {
		t.Errorf("config validate of the two set apart: %v, want an error naming both\n%s", err, out)
	}

	var stdout, stderr bytes.Buffer
	root := newRootCmd()
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetArgs([]string{"config", "dump", "--config", old})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	dumped, err := config.Decode(stdout.Bytes())
	if err != nil {
		t.Fatalf("the dump does not load back: %v\n%s", err, stdout.String())
	}
	if dumped.RegistryCheck.HostsDir != "/etc/node/certs.d" || len(dumped.Deprecations()) != 0 || strings.Contains(stdout.String(), "registryHostsDir") {
		t.Errorf("the dump kept the deprecated field or lost its value:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "ensureSecretPulledImages.registryHostsDir is deprecated: printed as registryCheck.hostsDir") {
		t.Errorf("config dump did not say it moved the field: %q", stderr.String())
	}
}
