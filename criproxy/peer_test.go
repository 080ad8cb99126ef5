package criproxy

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// helperClientEnv, when set to a socket, makes the test binary a CRI
// client that calls Version there and exits: copied under another name,
// it is a client process of that name.
const helperClientEnv = "CRIPROXY_TEST_CLIENT_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(helperRuntimeEnv); sock != "" {
		os.Exit(runHelperRuntime(sock))
	}
	if sock := os.Getenv(helperClientEnv); sock != "" {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(context.Background(), &runtimeapi.VersionRequest{})
		}
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestEachCallNotesItsClientByProcessName(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := newProxyRig(t, Options{Registerer: reg}, false)
	last := func(client string) float64 {
		return testutil.ToFloat64(r.server.metrics.lastCall[client])
	}
	if _, err := r.rt.Version(context.Background(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	if last(ClientOther) == 0 || last(ClientKubelet) != 0 {
		t.Fatalf("after a call from the test process: other %v, kubelet %v", last(ClientOther), last(ClientKubelet))
	}
	for _, name := range []string{"kubelet", "crictl"} {
		bin := filepath.Join(t.TempDir(), name)
		copyExecutable(t, bin)
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), helperClientEnv+"="+r.sock)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
	}
	if last(ClientKubelet) == 0 || last(ClientCrictl) == 0 {
		t.Errorf("after calls from processes named kubelet and crictl: kubelet %v, crictl %v", last(ClientKubelet), last(ClientCrictl))
	}
}

func TestClientClass(t *testing.T) {
	t.Parallel()
	for comm, want := range map[string]string{"kubelet": ClientKubelet, "crictl": ClientCrictl, "critest": ClientCrictl, "containerd": ClientOther, "": ClientOther, "kubelet-x": ClientOther} {
		if got := clientClass(comm); got != want {
			t.Errorf("clientClass(%q) = %q, want %q", comm, got, want)
		}
	}
}

func copyExecutable(t *testing.T, to string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
