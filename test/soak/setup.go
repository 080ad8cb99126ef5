package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// pluginRegistry is the name the plugin tenant pulls the authenticated
// registry by (the rig mirrors it there): the only name the credential
// provider matches, so that the private tenants' pulls get no node
// credential.
const pluginRegistry = "registry.rig.test"

// setUp pushes the images, fills the database, writes the proxy's
// configuration and starts it.
func (e *env) setUp(pluginDir string) ([]*tenant, error) {
	tenants := newTenants(e)
	var refs, markers []string
	for _, t := range tenants {
		for _, img := range t.images {
			refs = append(refs, img.path)
			markers = append(markers, "soak "+img.path)
		}
	}
	start := time.Now()
	logf("pushing %d images (busybox and a marker each)", len(refs))
	if _, err := e.rig.PushBusyboxes(refs, markers, 6); err != nil {
		return nil, err
	}
	logf("pushed %d images in %v", len(refs), time.Since(start).Round(time.Second))

	e.db = filepath.Join(e.work, "ensure.db")
	e.admin = filepath.Join(e.work, "admin.sock")
	start = time.Now()
	var err error
	if e.ballast, err = fillDatabase(e.db, e.o.records); err != nil {
		return nil, err
	}
	logf("filled the database with %d records in %v", e.o.records, time.Since(start).Round(time.Second))

	// The plugin's docker config: a node credential for pluginRegistry.
	dockerConfig := filepath.Join(e.work, "docker-config.json")
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{pluginRegistry: map[string]string{"username": "user", "password": rig.Users["user"]}}})
	if err := os.WriteFile(dockerConfig, b, 0o600); err != nil {
		return nil, err
	}
	e.plugins = filepath.Join(e.work, "credential-providers.json")
	if err := e.writeProviders(dockerConfig, 0); err != nil {
		return nil, err
	}
	cfg := filepath.Join(e.work, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ProxyConfiguration
logging:
  level: info
credentialProviders:
  config: %s
  binDir: %s
ensureSecretPulledImages:
  enabled: true
  databasePath: %s
  adminSocket: %s
  gcInterval: %s
  gracePeriod: %s
`, e.plugins, pluginDir, e.db, e.admin, e.o.gcInterval, e.o.gracePeriod)), 0o644); err != nil {
		return nil, err
	}
	if e.metrics, err = rig.FreeAddr(); err != nil {
		return nil, err
	}
	e.sock = filepath.Join(e.rig.Dir, "soak-proxy.sock")
	if e.proxy, err = e.rig.StartProxy(e.o.proxy, e.sock, "--config", cfg, "--monitoring-address", e.metrics, "--log-level", "info"); err != nil {
		return nil, err
	}
	logf("proxy %d serving on %s, metrics on %s, log %s", e.proxy.Pid(), e.sock, e.metrics, e.proxy.Log)
	if e.proxied, err = rig.DialCRI("unix://" + e.sock); err != nil {
		return nil, err
	}
	if e.direct, err = rig.DialCRI("unix://" + e.rig.RuntimeSock); err != nil {
		return nil, err
	}
	return tenants, nil
}

// writeProviders writes the credential provider configuration: the
// reference plugin for pluginRegistry, its cache duration one of two by
// the parity of n, so that each reload changes something.
func (e *env) writeProviders(dockerConfig string, n int) error {
	ttl := []string{"1m", "2m"}[n%2]
	b, _ := json.Marshal(map[string]any{"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
		"providers": []map[string]any{{"name": "docker-config-credential-provider", "matchImages": []string{pluginRegistry},
			"defaultCacheDuration": ttl, "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
			"args": []string{"--docker-config", dockerConfig}}}})
	tmp := e.plugins + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, e.plugins)
}

// fillDatabase writes n records of images that are not on the node (as
// test/bench does), last updated a year from now: the clean-up keeps them
// all run long, as it would the records of images on the node. It returns
// their image IDs.
func fillDatabase(path string, n int) ([]string, error) {
	s, err := records.Open(path, records.Options{})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ahead := metav1.NewTime(time.Now().AddDate(1, 0, 0))
	refs := make([]string, 0, n)
	for start := 0; start < n; start += 10000 {
		var recs []*ensure.Record
		for i := start; i < min(n, start+10000); i++ {
			ref := fmt.Sprintf("sha256:%064x", i+1)
			refs = append(refs, ref)
			recs = append(recs, &ensure.Record{
				ImageRef:        ref,
				LastUpdatedTime: ahead,
				CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{
					fmt.Sprintf("registry.soak.invalid/team-%d/app", i%500): {KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{{CredentialHash: fmt.Sprintf("sha256:%064x", i)}}},
				},
			})
		}
		if err := s.PutRecords(recs); err != nil {
			return nil, err
		}
	}
	return refs, nil
}
