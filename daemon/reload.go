package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// reloader applies a changed configuration while the daemon serves: on
// SIGHUP, and when the configuration file, the credential provider or
// image policy configuration (file or directory) or their plugins'
// directories change. It also watches the image policy plugins' own files
// (each provider's watchFiles): a change of one drops that provider's
// cached verdicts at once, with no reload (the plugin reads its files at
// each run), and whether or not a reload would be applied. A new configuration is loaded and checked whole (as
// serve and config validate would) before anything changes; then the
// credential providers, the image policy (every cached verdict dropped)
// and the ensure policy are swapped, each atomically. A configuration that
// fails, or that changes what only a restart can (the sockets, the
// runtime, the database, the API, turning a feature on or off), is
// refused with a log line and a metric, and the current one keeps serving.
//
// The kubelet reads its provider configuration once
// (https://github.com/kubernetes/kubernetes/issues/130420); operators
// rotating plugins across a fleet asked for better.
type reloader struct {
	load    func() (*config.ProxyConfiguration, error)
	current *config.ProxyConfiguration
	reloadTargets
	log *slog.Logger

	reloads *prometheus.CounterVec // result: applied, refused
	last    prometheus.Gauge       // the time of the last applied configuration
	lastOK  prometheus.Gauge       // 1 unless the last reload was refused
	info    *prometheus.GaugeVec   // hash
}

// reloadTargets are the components a reload applies a configuration to;
// a nil one is a feature that is off. They are all given to newReloader:
// the hash it publishes at the start covers their configurations.
type reloadTargets struct {
	injector *credplugins.Injector // credential injection
	guard    *ensure.Guard         // ensure: its policy and record expiry
	// registry is the registry check, whose vouched-for mirrors a reload
	// may change; nil without enforcement or image policy.
	registry *registry.Checker
	policy   *imagepolicy.Engine // the image policy
}

// debounce gathers the events of one change (an editor's write and
// rename, a package's files) into one reload.
const debounce = 500 * time.Millisecond

// newReloader publishes current as the configuration in use, with the
// configurations its targets hold, and returns the reloader that applies
// the next ones.
func newReloader(load func() (*config.ProxyConfiguration, error), current *config.ProxyConfiguration, targets reloadTargets, log *slog.Logger, reg prometheus.Registerer) (*reloader, error) {
	r := &reloader{load: load, current: current, reloadTargets: targets, log: log,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Name: "config_reloads_total",
			Help: "Configuration reloads (SIGHUP or a changed file), by result: applied, refused (the current configuration kept serving).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "cri_image_proxy", Name: "config_last_applied_timestamp_seconds",
			Help: "When the configuration in use was applied (the start, or the last reload applied).",
		}),
		// Prometheus's own prometheus_config_last_reload_successful: an alert
		// holds while the node runs an older configuration than its files,
		// and clears when a reload applies.
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "cri_image_proxy", Name: "config_last_reload_successful",
			Help: "1 when the last configuration reload was applied (or none was tried since the start), 0 when it was refused: the node runs an older configuration than its files.",
		}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "cri_image_proxy", Name: "config_info",
			Help: "Hash of the effective configuration in use (the file with the flags, the credential provider and the image policy configurations), as a label: a fleet shows who runs what.",
		}, []string{"hash"}),
	}
	for _, c := range []prometheus.Collector{r.reloads, r.last, r.lastOK, r.info} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	r.applied(current)
	return r, nil
}

// applied records cfg as the configuration in use.
func (r *reloader) applied(cfg *config.ProxyConfiguration) {
	r.current = cfg
	r.last.SetToCurrentTime()
	r.lastOK.Set(1)
	r.info.Reset()
	r.info.WithLabelValues(r.hash(cfg)).Set(1)
}

// hash identifies the effective configuration: the configuration with the
// flags, and the content of the credential provider and image policy
// configurations it names.
func (r *reloader) hash(cfg *config.ProxyConfiguration) string {
	h := sha256.New()
	b, _ := json.Marshal(cfg)
	h.Write(b)
	if r.injector != nil {
		h.Write([]byte(r.injector.Config().Hash))
	}
	if r.policy != nil {
		h.Write([]byte(r.policy.Config().Hash))
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil))[:19] // "sha256:" and 12 hex digits: enough to tell configurations apart
}

// Reload loads the configuration again and applies it, or refuses it.
func (r *reloader) Reload(why string) error {
	err := r.reload()
	if err != nil {
		r.reloads.WithLabelValues("refused").Inc()
		r.lastOK.Set(0)
		r.log.Error("configuration reload refused: the current configuration keeps serving", "trigger", why, "err", err)
		return err
	}
	r.reloads.WithLabelValues("applied").Inc()
	return nil
}

func (r *reloader) reload() error {
	cfg, err := r.load()
	if err != nil {
		return err
	}
	if fields := restartOnly(r.current, cfg); len(fields) > 0 {
		return fmt.Errorf("%s changed: only a restart applies that", strings.Join(fields, ", "))
	}
	// Everything is built and checked before anything is swapped.
	var providers *credplugins.Config
	if cp := cfg.CredentialProviders; cp != nil {
		if providers, err = credplugins.LoadConfig(cp.Config, cp.BinDir); err != nil {
			return err
		}
	}
	var imagePolicy *imagepolicy.Config
	if ip := cfg.ImagePolicy; ip != nil {
		if imagePolicy, err = imagepolicy.LoadConfig(ip.Config, ip.BinDir); err != nil {
			return err
		}
	}
	var policy decision.Policy
	if e := cfg.EnsureSecretPulledImages; e.Enabled {
		if policy, err = ensurePolicy(e); err != nil {
			return err
		}
	}
	if r.policy != nil && imagePolicy == nil {
		return errors.New("imagePolicy: the section is gone: only a restart turns the image policy off")
	}
	// The registry check's vouched mirrors, and the node's registries.conf
	// read again (a file that does not parse refuses the reload: the
	// checks keep the one read before).
	var registryReload *registry.Reloading
	if r.registry != nil {
		if err := registry.ValidateVouched(cfg.RegistryCheck.Vouched()); err != nil {
			return fmt.Errorf("registryCheck.vouchedMirrors: %w", err)
		}
		if registryReload, err = r.registry.PrepareReload(cfg.RegistryCheck.Vouched()); err != nil {
			return fmt.Errorf("registryCheck.registriesConf: %w", err)
		}
	}
	// Only the injector's swap can fail from here (a provider it cannot
	// build), and it comes first: a refusal leaves everything as it was.
	attrs := []any{}
	if r.injector != nil {
		rep, err := r.injector.Reload(providers)
		if err != nil {
			return err
		}
		attrs = append(attrs, "providersHash", providers.Hash, "kept", rep.Kept, "changed", rep.Changed, "added", rep.Added, "removed", rep.Removed)
	}
	if r.policy != nil {
		if err := r.policy.Reload(imagePolicy); err != nil {
			return err
		}
		attrs = append(attrs, "imagePolicyHash", imagePolicy.Hash, "imagePolicyProviders", len(imagePolicy.Providers))
	}
	if r.registry != nil {
		// Read and validated above, before anything was swapped.
		r.registry.ApplyReload(registryReload)
		attrs = append(attrs, "vouchedMirrors", len(cfg.RegistryCheck.VouchedMirrors))
	}
	if r.guard != nil {
		r.guard.SetPolicy(policy)
		r.guard.SetExpiry(cfg.EnsureSecretPulledImages.Expiry())
		attrs = append(attrs, "policy", policy.Name(), "maxRecordAge", cfg.EnsureSecretPulledImages.MaxRecordAge.Duration)
	}
	logDeprecations(r.log, newDeprecations(r.current, cfg))
	r.applied(cfg)
	r.log.Info("configuration reloaded", append(attrs, "hash", r.hash(cfg))...)
	if imagePolicy != nil {
		logImagePolicy(r.log, imagePolicy)
	}
	return nil
}

// restartOnly names what differs between the configurations outside what
// a reload applies: the credential provider and image policy
// configurations and plugins' directories, the ensure policy, its
// allowlist and the record expiry, and the registry check's vouched-for
// mirrors. The registry check's hosts directory, registries.conf and
// certs.d paths and bounds need a restart: checks in flight hold them
// (what the files hold is read again without one). The deprecated fields are left
// out: the registry check's section holds their values.
func restartOnly(old, next *config.ProxyConfiguration) []string {
	strip := func(c *config.ProxyConfiguration) map[string]any {
		var m map[string]any
		b, _ := json.Marshal(c)
		_ = json.Unmarshal(b, &m)
		for _, section := range []string{"credentialProviders", "imagePolicy"} {
			if cp, ok := m[section].(map[string]any); ok {
				delete(cp, "config")
				delete(cp, "binDir")
			}
		}
		if e, ok := m["ensureSecretPulledImages"].(map[string]any); ok {
			delete(e, "imagePullCredentialsVerificationPolicy")
			delete(e, "preloadedImagesVerificationAllowlist")
			delete(e, "maxRecordAge")
			delete(e, "maxRecordAgeByRepository")
			delete(e, "registryHostsDir")
			delete(e, "vouchedMirrors")
		}
		if rc, ok := m["registryCheck"].(map[string]any); ok {
			delete(rc, "vouchedMirrors")
		}
		return m
	}
	a, b := strip(old), strip(next)
	var out []string
	for k := range a {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// Run reloads on SIGHUP and on changes of the files until ctx is done.
func (r *reloader) Run(ctx context.Context, configPath string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("configuration files are not watched (SIGHUP still reloads)", "err", err)
	} else {
		defer w.Close()
		r.watch(w, configPath)
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = r.Reload("SIGHUP")
			r.watch(w, configPath) // the reload may name other directories
		case ev := <-events:
			if r.event(ev.Name, configPath) {
				timer = time.After(debounce)
			}
		case err := <-errs:
			r.log.Warn("watching the configuration files", "err", err)
		case <-timer:
			timer = nil
			_ = r.Reload("a configuration file changed")
			r.watch(w, configPath) // a provider directory may have appeared
		}
	}
}

// event handles a change fsnotify saw: a plugin's watched file drops that
// provider's verdicts now (each event: an editor's steps each change what
// the plugin would read, and a run between them must not stay cached);
// it reports whether the change calls for a reload, after the debounce.
func (r *reloader) event(path, configPath string) bool {
	if r.policy != nil {
		r.policy.FileChanged(path) // logs and counts what it drops
	}
	return r.relevant(path, configPath)
}

// watch watches the directories holding what a reload reads: a file is
// watched through its directory, so that an atomic replace (a rename
// over it, as editors and configuration tools do) is seen.
func (r *reloader) watch(w *fsnotify.Watcher, configPath string) {
	if w == nil {
		return
	}
	for _, dir := range r.watched(configPath) {
		if err := w.Add(dir); err != nil {
			r.log.Debug("not watching a configuration directory", "dir", dir, "err", err)
		}
	}
	if r.policy == nil {
		return
	}
	// A plugin's files that cannot be watched leave its verdicts cached
	// after a change: the operator must hear of it.
	for _, dir := range r.policy.WatchedDirs() {
		if err := w.Add(dir); err != nil {
			r.log.Warn("image policy: a plugin's files are not watched; a change of them takes effect at a reload (SIGHUP) or when the cached verdicts expire", "dir", dir, "err", err)
		}
	}
}

// watched are the directories of the configuration file, the provider
// and image policy configurations (a file's directory, or the directory
// itself) and their plugins' directories.
func (r *reloader) watched(configPath string) []string {
	var dirs []string
	if configPath != "" {
		dirs = append(dirs, filepath.Dir(configPath))
	}
	for _, pc := range r.pluginConfigs() {
		if fi, err := os.Stat(pc.config); err == nil && fi.IsDir() {
			dirs = append(dirs, pc.config)
		} else {
			dirs = append(dirs, filepath.Dir(pc.config))
		}
		dirs = append(dirs, pc.binDir)
	}
	return dirs
}

// pluginConfig is where a plugin section's configuration and plugins are.
type pluginConfig struct{ config, binDir string }

// pluginConfigs are those of the configuration in use.
func (r *reloader) pluginConfigs() []pluginConfig {
	var out []pluginConfig
	if cp := r.current.CredentialProviders; cp != nil {
		out = append(out, pluginConfig{cp.Config, cp.BinDir})
	}
	if ip := r.current.ImagePolicy; ip != nil {
		out = append(out, pluginConfig{ip.Config, ip.BinDir})
	}
	return out
}

// relevant reports whether a change of path can change the configuration.
func (r *reloader) relevant(path, configPath string) bool {
	if configPath != "" && filepath.Clean(path) == filepath.Clean(configPath) {
		return true
	}
	dir := filepath.Dir(path)
	for _, pc := range r.pluginConfigs() {
		if filepath.Clean(path) == filepath.Clean(pc.config) || dir == filepath.Clean(pc.config) || dir == filepath.Clean(pc.binDir) {
			return true
		}
	}
	return false
}
