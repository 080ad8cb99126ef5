package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/e2e/rig"
)

func main() {
	keep := flag.Bool("keep", false, "leave the demo running until Ctrl-C")
	flag.Parse()
	if err := run(*keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("\n\033[1m==> %s\033[0m\n", fmt.Sprintf(format, args...))
}

func run(keep bool) error {
	work, err := os.MkdirTemp("", "demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "cri-image-proxy")
	step("building cri-image-proxy")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/cri-image-proxy").CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v: %s", err, out)
	}

	step("starting a private containerd and a registry with htpasswd authentication (127.0.0.1 only)")
	r, err := rig.Start(rig.Options{Logf: func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer r.Stop()

	sock := filepath.Join(r.Dir, "cri-image-proxy.sock")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mon := l.Addr().String()
	l.Close()
	step("starting cri-image-proxy on %s, forwarding to containerd", sock)
	proxy, err := r.StartProxy(bin, sock, "--monitoring-address", mon, "--log-level", "info")
	if err != nil {
		return err
	}
	defer proxy.Stop(10 * time.Second)

	ep := "unix://" + sock
	image := r.Registry + "/" + rig.TeamAImage
	crictl := func(args ...string) rig.Result {
		fmt.Printf("$ crictl %s\n", strings.Join(args, " "))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res := r.Crictl(ctx, ep, args...)
		fmt.Print(indent(res.Stdout))
		if res.Err != nil {
			fmt.Print(indent(lastLine(res.Stderr)))
		}
		return res
	}

	step("crictl talks to the proxy exactly as it would to containerd")
	crictl("version")

	step("a private image: without credentials the registry says 401, through the proxy as without it")
	if res := crictl("pull", image); res.Err == nil {
		return fmt.Errorf("an anonymous pull of a private image succeeded")
	}

	step("with credentials the pull succeeds")
	if res := crictl("pull", "--creds", "user:"+rig.Users["user"], image); res.Err != nil {
		return fmt.Errorf("pull with credentials failed")
	}
	crictl("images")

	step("pods and containers run through the proxy too")
	bb := r.Registry + "/" + rig.BusyboxImage
	if res := crictl("pull", "--creds", "user:"+rig.Users["user"], bb); res.Err != nil {
		return fmt.Errorf("pull busybox failed")
	}
	pod := filepath.Join(work, "pod.json")
	ctr := filepath.Join(work, "ctr.json")
	os.WriteFile(pod, []byte(fmt.Sprintf(`{"metadata":{"name":"demo","namespace":"demo","uid":"demo-uid","attempt":1},"log_directory":%q,"linux":{"security_context":{"namespace_options":{"network":2}}}}`, work)), 0o644)
	os.WriteFile(ctr, []byte(fmt.Sprintf(`{"metadata":{"name":"hello"},"image":{"image":%q},"command":["sh","-c","echo hello from a container started through cri-image-proxy; sleep 3600"],"log_path":"hello.log","linux":{}}`, bb)), 0o644)
	podID := strings.TrimSpace(crictl("runp", pod).Stdout)
	ctrID := strings.TrimSpace(crictl("create", podID, ctr, pod).Stdout)
	crictl("start", ctrID)
	crictl("exec", ctrID, "uname", "-sr")
	time.Sleep(300 * time.Millisecond)
	crictl("logs", ctrID)
	crictl("stopp", podID)
	crictl("rmp", podID)

	step("the proxy's metrics (http://%s/metrics), an excerpt", mon)
	if resp, err := http.Get("http://" + mon + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "cri_image_proxy_requests_total") || strings.HasPrefix(line, "cri_image_proxy_backend_up") {
				fmt.Println("    " + line)
			}
		}
	}

	if keep {
		step("running; try it yourself, then press Ctrl-C to stop everything")
		fmt.Printf("    %s/crictl --runtime-endpoint %s --image-endpoint %s images\n", r.ToolsDir, ep, ep)
		fmt.Printf("    registry: http://%s (users: user/%s, alice/%s, bob/%s)\n", r.Registry, rig.Users["user"], rig.Users["alice"], rig.Users["bob"])
		fmt.Printf("    logs: %s\n", r.Dir)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	step("stopping the proxy, containerd and the registry")
	return nil
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
