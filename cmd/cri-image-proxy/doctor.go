package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/kubeletprobe"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// staleKubelet is how long the kubelet may go without a call before the
// doctor says it reaches the runtime another way: it relists pods every
// second and checks the runtime's status every few.
const staleKubelet = time.Minute

func newDoctorCmd() *cobra.Command {
	var pid int
	var proc string
	return configCmd("doctor", "Check that the node's kubelet really calls the proxy",
		`Find the running kubelet, resolve its CRI endpoints as it does (its flags over the
drop-ins of --config-dir over its --config file over the default; the field is
containerRuntimeEndpoint in the KubeletConfiguration, the flag --container-runtime-endpoint
is deprecated), compare them with the proxy's socket, and read from the proxy's metrics
when the kubelet last called. Exits non-zero when the kubelet bypasses the proxy.

First it says which registry configuration the registry check reads (containerd's
hosts.toml directories, or CRI-O's registries.conf with --registries-conf) and what
it makes of each registry there: the endpoint it asks, the mirrors it never asks,
insecure and blocked ones. A file it cannot read is a problem.

Takes the proxy's --config and serve flags, to know its socket and monitoring address.`,
		func(cmd *cobra.Command) {
			cmd.Flags().IntVar(&pid, "kubelet-pid", 0, "the kubelet's process ID (default: the oldest process named kubelet)")
			cmd.Flags().StringVar(&proc, "proc", "/proc", "the proc file system")
		},
		func(cmd *cobra.Command, cfg *config.ProxyConfiguration) error {
			registryProblems := doctorRegistryCheck(cmd.Context(), cmd.OutOrStdout(), cfg)
			problems := doctor(cmd.Context(), cmd.OutOrStdout(), cfg, proc, pid, time.Now())
			switch {
			case problems > 0:
				return fmt.Errorf("%d problem(s): the kubelet does not go through the proxy", problems+registryProblems)
			case registryProblems > 0:
				return fmt.Errorf("%d problem(s) in the registry configuration the registry check reads", registryProblems)
			}
			return nil
		})
}

// doctor prints what it finds and returns the number of problems.
func doctor(ctx context.Context, out io.Writer, cfg *config.ProxyConfiguration, proc string, pid int, now time.Time) (problems int) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(out, "FAIL  "+format+"\n", args...)
		problems++
	}
	var err error
	if pid == 0 {
		if pid, err = kubeletprobe.Find(proc); err != nil {
			fail("kubelet: %v", err)
			return problems
		}
	}
	p, err := kubeletprobe.Open(proc, pid)
	if err != nil {
		fail("%v", err)
		return problems
	}
	fmt.Fprintf(out, "ok    kubelet: pid %d, %s\n", pid, p.Args[0])
	e, err := p.Endpoints()
	if err != nil {
		fail("%v", err)
		return problems
	}
	socket := filepath.Clean(cfg.Socket.Path)
	for _, c := range []struct {
		what string
		e    kubeletprobe.Endpoint
		fix  string
	}{
		{"runtime endpoint", e.Runtime, "containerRuntimeEndpoint"},
		{"image endpoint", e.Image, "imageServiceEndpoint"},
	} {
		if kubeletprobe.SocketPath(c.e.Value) == socket {
			fmt.Fprintf(out, "ok    %s: %s (%s), the proxy's socket\n", c.what, c.e.Value, c.e.From)
			continue
		}
		where := "in its KubeletConfiguration"
		if e.ConfigFile != "" {
			where = "in " + e.ConfigFile
		}
		fail("%s: %s (%s): the kubelet bypasses the proxy, whose socket is %s. Set %s: unix://%s %s, and drop any --container-runtime-endpoint or --image-service-endpoint flag and drop-in that overrides it",
			c.what, c.e.Value, c.e.From, socket, c.fix, socket, where)
	}
	if cfg.Monitoring.Address == "-" {
		fmt.Fprintln(out, "warn  last kubelet call: unknown, the proxy's monitoring is off")
		return problems
	}
	last, err := lastKubeletCall(ctx, cfg.Monitoring.Address)
	switch {
	case err != nil:
		fmt.Fprintf(out, "warn  last kubelet call: unknown: %v\n", err)
	case last.IsZero():
		fail("last kubelet call: never, since the proxy started")
	case now.Sub(last) > staleKubelet:
		fail("last kubelet call: %v ago: the kubelet reaches the runtime another way (or has stopped)", now.Sub(last).Round(time.Second))
	default:
		fmt.Fprintf(out, "ok    last kubelet call: %v ago\n", now.Sub(last).Round(time.Millisecond))
	}
	return problems
}

// lastKubeletCall reads cri_image_proxy_client_last_call_timestamp_seconds
// {client="kubelet"} from the proxy's metrics; zero when it never called.
func lastKubeletCall(ctx context.Context, address string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/metrics", nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("GET %s/metrics: %s", address, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return time.Time{}, fmt.Errorf("the proxy's metrics: %w", err)
	}
	const name = "cri_image_proxy_client_last_call_timestamp_seconds"
	f, ok := families[name]
	if !ok {
		return time.Time{}, errors.New("the proxy exports no " + name + " (an older version?)")
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "client" && l.GetValue() == criproxy.ClientKubelet {
				v := m.GetGauge().GetValue()
				if v == 0 {
					return time.Time{}, nil
				}
				return time.Unix(0, int64(v*float64(time.Second))), nil
			}
		}
	}
	return time.Time{}, nil
}

// doctorRegistryCheck prints the registry configuration the registry check
// reads, as the daemon reads it, and returns the number of problems: a
// configuration that does not load, a registry whose checks would fail
// before they ask (its TLS files).
func doctorRegistryCheck(ctx context.Context, out io.Writer, cfg *config.ProxyConfiguration) (problems int) {
	rc := cfg.RegistryCheck
	c, err := registry.New(registry.Options{HostsDir: rc.HostsDir, RegistriesConf: rc.RegistriesConf, CertsDir: rc.CertsDir, Vouched: rc.Vouched()})
	if err != nil {
		fmt.Fprintf(out, "FAIL  registry check: %v\n", err)
		return 1
	}
	rep := c.Describe(ctx)
	switch rep.Runtime {
	case "CRI-O":
		read := "none of its files exists: no registry configured"
		if len(rep.Read) > 0 {
			read = strings.Join(rep.Read, ", ")
		}
		fmt.Fprintf(out, "ok    registry check: reads CRI-O's registries.conf (%s): %s; TLS files from %s\n", rc.RegistriesConf, read, strings.Join(rep.CertsDir, ":"))
	default:
		fmt.Fprintf(out, "ok    registry check: reads containerd's hosts.toml under %s\n", strings.Join(rep.Read, ":"))
	}
	if len(rep.Registries) == 0 {
		fmt.Fprintln(out, "      every registry is asked at its own host over https")
	}
	for _, r := range rep.Registries {
		mark := "      "
		if r.Problem != "" {
			mark = "FAIL  "
			problems++
		}
		fmt.Fprintf(out, "%s%s\n", mark, r)
	}
	return problems
}
