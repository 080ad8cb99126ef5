package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// injectEnv is what the credential injection scenarios need: two proxies
// with the reference plugin (docker config.json), one caching its answers
// for 5 minutes and one not caching (cacheDuration 0: an exec per pull),
// each plugin wrapped to count its runs.
type injectEnv struct {
	cached, uncached       *grpc.ClientConn
	cachedPid, uncachedPid int
	countDir               string
	mark                   int // execs before a scenario
}

func (e *benchEnv) setUpInjection() error {
	dir := filepath.Join(e.work, "plugins")
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	plugin := filepath.Join(e.work, "docker-config-credential-provider")
	if out, err := exec.Command("go", "build", "-o", plugin, "./cmd/docker-config-credential-provider").CombinedOutput(); err != nil {
		return fmt.Errorf("build plugin: %v: %s", err, out)
	}
	dockerConfig := filepath.Join(dir, "config.json")
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{e.rig.Registry: map[string]string{"username": "alice", "password": rig.Users["alice"]}}})
	if err := os.WriteFile(dockerConfig, b, 0o600); err != nil {
		return err
	}
	e.inject = &injectEnv{countDir: dir}
	for _, v := range []struct {
		name string
		ttl  string
		conn **grpc.ClientConn
		pid  *int
	}{{"cached", "5m", &e.inject.cached, &e.inject.cachedPid}, {"uncached", "0s", &e.inject.uncached, &e.inject.uncachedPid}} {
		if err := rig.WrapPlugin(filepath.Join(binDir, v.name), plugin, filepath.Join(dir, v.name+".count")); err != nil {
			return err
		}
		cfg := filepath.Join(dir, v.name+".json")
		b, _ := json.Marshal(map[string]any{"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
			"providers": []map[string]any{{"name": v.name, "matchImages": []string{e.rig.Registry}, "defaultCacheDuration": v.ttl,
				"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "args": []string{"--docker-config", dockerConfig}}}})
		if err := os.WriteFile(cfg, b, 0o644); err != nil {
			return err
		}
		sock := filepath.Join(e.rig.Dir, "bench-"+v.name+".sock")
		p, err := e.rig.StartProxy(e.opts.proxy, sock, "--log-level", "info",
			"--image-credential-provider-config", cfg, "--image-credential-provider-bin-dir", binDir)
		if err != nil {
			return err
		}
		e.extraProxies = append(e.extraProxies, p)
		*v.pid = p.Pid()
		if *v.conn, err = rig.DialCRI("unix://" + sock); err != nil {
			return err
		}
	}
	e.pids["proxy-cached"] = e.inject.cachedPid
	e.pids["proxy-uncached"] = e.inject.uncachedPid
	return nil
}

// execs returns how many times the named plugin wrapper ran.
func (ie *injectEnv) execs(name string) int { return execCount(ie.countDir, name) }

// execCount counts the runs a plugin wrapper logged in dir/name.count.
func execCount(dir, name string) int {
	b, _ := os.ReadFile(filepath.Join(dir, name+".count"))
	return strings.Count(string(b), "\n")
}

// aliceAuth is tenant A's credential, as a pull request carries it.
var aliceAuth = &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}

func pullCall(cc *grpc.ClientConn, image string, auth *runtimeapi.AuthConfig) call {
	c := runtimeapi.NewImageServiceClient(cc)
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth}
	return func(ctx context.Context) error {
		_, err := c.PullImage(ctx, req)
		return err
	}
}

// injectionScenarios measure credential injection against pulls that
// bring their own credentials, on an image already present (containerd
// still resolves it at the registry: two requests per pull).
func injectionScenarios() []measurement {
	needs := []part{injectionProxies}
	return []measurement{
		scenarioOf("PullImage(present) c=1, credentials in the request vs injected from the cache", needs, func(e *benchEnv) scenario {
			img, ie := e.presentImage, e.inject
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "direct, with credentials", call: pullCall(e.direct, img, aliceAuth), cpu: []string{"containerd"}},
					{name: "proxied pass-through, with credentials", call: pullCall(e.proxied, img, aliceAuth), cpu: []string{"proxy"}},
					{name: "proxied, injected (cache hit)", call: pullCall(ie.cached, img, nil), cpu: []string{"proxy-cached"}},
				},
				notes: func(r *result) string {
					hook := time.Duration(r.armMedian(2, func(s segment) float64 { return float64(s.cpuPerCall("proxy-cached")) })) -
						time.Duration(r.armMedian(1, func(s segment) float64 { return float64(s.cpuPerCall("proxy")) }))
					return fmt.Sprintf("injected (cache hit) over pass-through: p50 ratio %.3f, proxy CPU %+.0f µs/call (the hook alone: see BenchmarkPullImageHookCacheHit below)", ratioOf(2, 1)(r), float64(hook)/1e3)
				},
			}
		}),
		scenarioOf("PullImage(present) c=1, plugin cached vs run on every pull", needs, func(e *benchEnv) scenario {
			img, ie := e.presentImage, e.inject
			return scenario{
				conc: 1,
				arms: []arm{
					{name: "injected (cache hit)", call: pullCall(ie.cached, img, nil), cpu: []string{"proxy-cached"}},
					{name: "injected (exec every pull)", call: pullCall(ie.uncached, img, nil), cpu: []string{"proxy-uncached"}},
				},
				notes: func(r *result) string {
					return fmt.Sprintf("exec cost (p50 difference): %s µs", us(r.p50Delta(1)))
				},
			}
		}),
		scenarioOf("PullImage(present) c=64, plugin not cached: singleflight", needs, func(e *benchEnv) scenario {
			img, ie := e.presentImage, e.inject
			return scenario{
				conc: 64,
				arms: []arm{
					{name: "direct, with credentials", call: pullCall(e.direct, img, aliceAuth), cpu: []string{"containerd"}},
					{name: "injected (exec per flight)", call: pullCall(ie.uncached, img, nil), cpu: []string{"proxy-uncached"}},
				},
				before: func() { ie.mark = ie.execs("uncached") },
				notes: func(r *result) string {
					calls := 0
					for _, round := range r.rounds {
						calls += round[1].calls
					}
					calls += r.warmupCalls[1]
					n := ie.execs("uncached") - ie.mark
					return fmt.Sprintf("%d plugin execs for %d injected pulls at c=64 (%.3f per pull; without singleflight: 1 per pull)", n, calls, float64(n)/float64(calls))
				},
			}
		}),
	}
}
