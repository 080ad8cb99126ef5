package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The rig shared by the tests of this package, and the proxy in front of it.
var (
	testRig    *rig.Rig
	proxyBin   string // the cri-image-proxy binary under test
	pluginBin  string // the docker-config-credential-provider plugin
	tokenBin   string // the sa-token-credential-provider plugin
	proxySock  string // where the shared proxy serves
	proxyProc  *rig.Proc
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "e2e tests need root (a private containerd, mounts); they were NOT run"
		fmt.Fprintln(os.Stderr, "\n!!! SKIPPING E2E:", skipReason, "!!!")
		return m.Run()
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[e2e %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "e2e-bin")
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer os.RemoveAll(dir)
	proxyBin = filepath.Join(dir, "cri-image-proxy")
	logf("building %s", proxyBin)
	pluginBin = filepath.Join(dir, "docker-config-credential-provider")
	tokenBin = filepath.Join(dir, "sa-token-credential-provider")
	for bin, pkg := range map[string]string{proxyBin: "../../cmd/cri-image-proxy", pluginBin: "../../cmd/docker-config-credential-provider", tokenBin: "../../cmd/sa-token-credential-provider"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			logf("build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}

	// The runtime is chosen here, not inside Start, so that the run says
	// first what it runs on (RUNTIME, CONTAINERD: see Makefile).
	runtime, err := rig.RuntimeFromEnv(rig.DefaultToolsDir())
	if err != nil {
		logf("choosing the runtime: %v", err)
		return 1
	}
	logf("runtime: %s (RUNTIME=%q CONTAINERD=%q)", runtime.Name, os.Getenv("RUNTIME"), os.Getenv("CONTAINERD"))
	// The registry names its users: tests show whose credential a pull
	// used (RegistryUsers).
	testRig, err = rig.Start(rig.Options{Logf: logf, RegistryUsers: true, Runtime: runtime})
	if err != nil {
		logf("starting the rig: %v", err)
		return 1
	}
	defer func() {
		logf("stopping the rig")
		if keep := os.Getenv("E2E_KEEP_LOGS"); keep != "" {
			exec.Command("sh", "-c", "mkdir -p "+keep+" && cd "+testRig.Dir+" && find . -name '*.log' -exec cp --parents {} "+keep+" \\;").Run()
		}
		if testKube != nil {
			testKube.Stop()
		}
		if proxyProc != nil {
			proxyProc.Stop(10 * time.Second)
		}
		if err := testRig.Stop(); err != nil {
			logf("stopping the rig: %v", err)
		}
	}()
	proxySock = filepath.Join(testRig.Dir, "proxy.sock")
	if proxyProc, err = testRig.StartProxy(proxyBin, proxySock); err != nil {
		logf("starting the proxy: %v", err)
		return 1
	}
	logf("ready: %s %s, registry %s, proxy %s", testRig.Runtime.Name, testRig.RuntimeSock, testRig.Registry, proxySock)
	code := m.Run()
	if code != 0 {
		logf("proxy log: %s; %s log: %s", proxyProc.Log, testRig.Runtime.Name, testRig.RuntimeProc().Log)
		dumpTail(logf, proxyProc.Log, 40)
	}
	return code
}

// needRig skips the test, loudly, when the package could not start a rig.
func needRig(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip("SKIPPED:", skipReason)
	}
}

// startProxy starts a proxy of its own for the test, with args, in front of
// the rig's containerd, serving on name.sock in the rig's directory; it
// stops when the test ends. It returns the proxy's endpoint.
func startProxy(t *testing.T, name string, args ...string) (endpoint string, p *rig.Proc) {
	t.Helper()
	sock := filepath.Join(testRig.Dir, name+".sock")
	p, err := testRig.StartProxy(proxyBin, sock, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	return "unix://" + sock, p
}

// direct and proxied are the two CRI endpoints the tests compare.
func direct() string  { return "unix://" + testRig.RuntimeSock }
func proxied() string { return "unix://" + proxySock }

func crictl(t *testing.T, endpoint string, args ...string) rig.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return testRig.Crictl(ctx, endpoint, args...)
}

// mustCrictl runs crictl and fails the test when it fails.
func mustCrictl(t *testing.T, endpoint string, args ...string) string {
	t.Helper()
	res := crictl(t, endpoint, args...)
	if res.Err != nil {
		t.Fatalf("crictl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.Err, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func dumpTail(logf func(string, ...any), path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	logf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
}
