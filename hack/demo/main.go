package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

func main() {
	keep := flag.Bool("keep", false, "leave the demo running until Ctrl-C")
	binDir := flag.String("bin-dir", "", "where cri-image-proxy and docker-config-credential-provider are already built (make demo); empty builds them")
	flag.Parse()
	if err := run(*keep, *binDir); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("\n\033[1m==> %s\033[0m\n", fmt.Sprintf(format, args...))
}

func run(keep bool, binDir string) error {
	work, err := os.MkdirTemp("", "demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "cri-image-proxy")
	plugin := filepath.Join(work, "plugins", "node-creds")
	if err := os.MkdirAll(filepath.Dir(plugin), 0o755); err != nil {
		return err
	}
	if binDir != "" {
		if binDir, err = filepath.Abs(binDir); err != nil {
			return err
		}
		step("cri-image-proxy and the reference credential plugin, built in %s", binDir)
		for dst, src := range map[string]string{bin: "cri-image-proxy", plugin: "docker-config-credential-provider"} {
			if err := os.Symlink(filepath.Join(binDir, src), dst); err != nil {
				return err
			}
		}
	} else {
		step("building cri-image-proxy and the reference credential plugin")
		for out, pkg := range map[string]string{bin: "./cmd/cri-image-proxy", plugin: "./cmd/docker-config-credential-provider"} {
			if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
				return fmt.Errorf("build %s: %v: %s", pkg, err, b)
			}
		}
	}

	rt, err := demoRuntime()
	if err != nil {
		return err
	}
	step("starting a private %s and a registry with htpasswd authentication (127.0.0.1 only)", rt.Name)
	r, err := rig.Start(rig.Options{Runtime: rt, Logf: func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer r.Stop()

	// The node's credentials for team-b's images, in a docker config.json
	// the reference plugin reads; the kubelet-format provider config.
	dockerConfig := filepath.Join(work, "plugins", "config.json")
	os.WriteFile(dockerConfig, []byte(fmt.Sprintf(`{"auths":{%q:{"username":"user","password":%q}}}`, r.Registry+"/team-b", rig.Users["user"])), 0o600)
	providers := filepath.Join(work, "providers.yaml")
	os.WriteFile(providers, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: node-creds
    matchImages: ["%s/team-b"]
    defaultCacheDuration: 5m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--docker-config", "%s"]
`, r.Registry, dockerConfig)), 0o644)

	sock := filepath.Join(r.Dir, "cri-image-proxy.sock")
	admin := filepath.Join(work, "admin.sock")
	db := filepath.Join(work, "ensure.db")
	mon, err := rig.FreeAddr()
	if err != nil {
		return err
	}
	step("starting cri-image-proxy on %s, forwarding to %s, with credential injection and ensure-secret-pulled-images", sock, r.Runtime.Name)
	proxy, err := r.StartProxy(bin, sock, "--monitoring-address", mon, "--log-level", "info",
		"--image-credential-provider-config", providers, "--image-credential-provider-bin-dir", filepath.Dir(plugin),
		"--ensure-secret-pulled-images", "--ensure-database", db, "--admin-socket", admin)
	if err != nil {
		return err
	}
	defer proxy.Stop(10 * time.Second)

	ep := "unix://" + sock
	image := r.Registry + "/" + rig.TeamAImage
	run := func(endpoint string, args ...string) rig.Result {
		who := "crictl"
		if endpoint != ep {
			who = "crictl (straight to " + r.Runtime.Name + ")"
		}
		fmt.Printf("$ %s %s\n", who, strings.Join(args, " "))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res := r.Crictl(ctx, endpoint, args...)
		fmt.Print(indent(res.Stdout))
		if res.Err != nil {
			fmt.Print(indent(lastLine(res.Stderr)))
		}
		return res
	}
	crictl := func(args ...string) rig.Result { return run(ep, args...) }
	tenant := func(name string) string {
		path := filepath.Join(work, name+".json")
		os.WriteFile(path, []byte(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":%q,"uid":"%s-uid","attempt":1},"log_directory":%q,"linux":{"security_context":{"namespace_options":{"network":2}}}}`, name, name, name, work)), 0o644)
		return path
	}
	tenantA, tenantB := tenant("tenant-a"), tenant("tenant-b")

	step("crictl talks to the proxy exactly as it would to %s", r.Runtime.Name)
	crictl("version")

	step("a private image: without credentials the registry refuses, through the proxy as without it")
	if res := crictl("pull", image); res.Err == nil {
		return fmt.Errorf("an anonymous pull of a private image succeeded")
	}

	step("tenant A pulls it with its own credentials (its pod's identity comes with the pull)")
	if res := crictl("pull", "--pod-config", tenantA, "--creds", "alice:"+rig.Users["alice"], image); res.Err != nil {
		return fmt.Errorf("pull with credentials failed")
	}

	step("tenant B has no credentials: the image is on the node, but not for B (https://github.com/kubernetes/kubernetes/issues/18787)")
	idOnly := []string{"inspecti", "-o", "go-template", "--template", "{{.status.id}}", image}
	run("unix://"+r.RuntimeSock, idOnly...)
	crictl(idOnly...)
	if res := crictl("pull", "--pod-config", tenantB, image); res.Err == nil {
		return fmt.Errorf("tenant B pulled a private image without credentials")
	}

	step("tenant B with its own valid credentials: verified once by the registry, then served")
	if res := crictl("pull", "--pod-config", tenantB, "--creds", "bob:"+rig.Users["bob"], image); res.Err != nil {
		return fmt.Errorf("tenant B's pull with its credentials failed")
	}

	step("what the proxy remembers: salted hashes, never a password")
	fmt.Printf("$ cri-image-proxy records list\n")
	if out, err := exec.Command(bin, "records", "list", "--admin-socket", admin).CombinedOutput(); err == nil {
		fmt.Print(indent(string(out)))
	} else {
		return fmt.Errorf("records list: %v: %s", err, out)
	}

	step("a pull without credentials of team-b's image: the node's credential plugin supplies them")
	if res := crictl("pull", r.Registry+"/"+rig.TeamBImage); res.Err != nil {
		return fmt.Errorf("pull with injected credentials failed")
	}

	step("pods and containers run through the proxy too")
	bb := r.Registry + "/" + rig.BusyboxImage
	pod := tenant("demo")
	if res := crictl("pull", "--pod-config", pod, "--creds", "user:"+rig.Users["user"], bb); res.Err != nil {
		return fmt.Errorf("pull busybox failed")
	}
	ctr := filepath.Join(work, "ctr.json")
	os.WriteFile(ctr, []byte(fmt.Sprintf(`{"metadata":{"name":"hello"},"image":{"image":%q},"command":["sh","-c","echo hello from a container started through cri-image-proxy; sleep 3600"],"log_path":"hello.log","linux":{}}`, bb)), 0o644)
	podID := strings.TrimSpace(crictl("runp", pod).Stdout)
	ctrID := strings.TrimSpace(crictl("create", podID, ctr, pod).Stdout)
	crictl("start", ctrID)
	crictl("exec", ctrID, "uname", "-sr")
	time.Sleep(300 * time.Millisecond)
	crictl("logs", ctrID)
	crictl("stopp", podID)
	crictl("rmp", podID)

	if !r.Runtime.Legacy() {
		step("tenant C, without credentials, mounts A's image as an image volume (by its ID): refused")
		tenantC := tenant("tenant-c")
		id := strings.TrimSpace(run("unix://"+r.RuntimeSock, idOnly...).Stdout)
		public := r.AnonRegistry + "/" + rig.BusyboxImage // a public image, pulled anonymously
		crictl("pull", public)
		vol := filepath.Join(work, "vol.json")
		os.WriteFile(vol, []byte(fmt.Sprintf(`{"metadata":{"name":"peek"},"image":{"image":%q},"command":["cat","/vol/marker"],"mounts":[{"container_path":"/vol","readonly":true,"image":{"image":%q}}],"log_path":"peek.log","linux":{}}`, public, id)), 0o644)
		podC := strings.TrimSpace(crictl("runp", tenantC).Stdout)
		if res := crictl("create", podC, vol, tenantC); res.Err == nil {
			return fmt.Errorf("tenant C's container mounting A's image was created")
		}
		crictl("stopp", podC)
		crictl("rmp", podC)
	}

	step("the proxy's metrics (http://%s/metrics), an excerpt", mon)
	if resp, err := http.Get("http://" + mon + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "cri_image_proxy_requests_total") || strings.HasPrefix(line, "cri_image_proxy_backend_up") ||
				strings.HasPrefix(line, "cri_image_proxy_ensure_") || strings.HasPrefix(line, "cri_image_proxy_credential_injection") {
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
	step("stopping the proxy, %s and the registry", r.Runtime.Name)
	return nil
}

// demoRuntime is the runtime of $RUNTIME and $CONTAINERD, as for the
// tests; with both unset, containerd 2.3 once a full install (make deps)
// has built it, and until then Debian's 1.6, so that a first demo does not
// wait for that build.
func demoRuntime() (rig.Runtime, error) {
	rt, err := rig.RuntimeFromEnv(rig.DefaultToolsDir())
	if err == nil || os.Getenv("CONTAINERD") != "" || os.Getenv("RUNTIME") != "" {
		return rt, err
	}
	fmt.Println("    containerd 2.3 is not built yet (make deps builds it, about 20 minutes): this demo runs on Debian's containerd 1.6")
	os.Setenv("CONTAINERD", "1.6")
	return rig.RuntimeFromEnv(rig.DefaultToolsDir())
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
