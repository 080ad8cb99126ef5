package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// TestInstall runs make install into a staging root, checks what it put
// there, and has systemd-analyze verify the unit and the kubelet drop-in
// as systemd would load them.
func TestInstall(t *testing.T) {
	needRig(t)
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatalf("systemd-analyze (Debian package systemd, hack/install-deps.sh installs it): %v", err)
	}
	root := t.TempDir()
	mk := func(target string) {
		t.Helper()
		out, err := exec.Command("make", "-C", "../..", target, "DESTDIR="+root, "BIN="+filepath.Join(root, "build")).CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	mk("install")
	bin := filepath.Join(root, "usr/local/bin/cri-image-proxy")
	unit := filepath.Join(root, "etc/systemd/system/cri-image-proxy.service")
	socketUnit := filepath.Join(root, "etc/systemd/system/cri-image-proxy.socket")
	cfg := filepath.Join(root, "etc/cri-image-proxy/config.yaml")
	for path, mode := range map[string]os.FileMode{bin: 0o755, unit: 0o644, socketUnit: 0o644, cfg: 0o644} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v (mode %v, want %v)", path, err, fi.Mode().Perm(), mode)
		}
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil {
		t.Errorf("the installed binary: %v\n%s", err, out)
	}

	t.Run("systemd-analyze verify finds nothing to say of the unit and the kubelet drop-in", func(t *testing.T) {
		// The unit as installed, its ExecStart pointing at the staged binary
		// (verify checks that it is executable), and a stand-in kubelet.service
		// to carry the drop-in.
		dir := t.TempDir()
		data, _ := os.ReadFile(unit)
		os.WriteFile(filepath.Join(dir, "cri-image-proxy.service"), []byte(strings.ReplaceAll(string(data), "/usr/local/bin/cri-image-proxy", bin)), 0o644)
		socket, _ := os.ReadFile(socketUnit)
		os.WriteFile(filepath.Join(dir, "cri-image-proxy.socket"), socket, 0o644)
		os.WriteFile(filepath.Join(dir, "kubelet.service"), []byte("[Unit]\nDescription=stand-in kubelet\n[Service]\nExecStart=/bin/true\n"), 0o644)
		os.MkdirAll(filepath.Join(dir, "kubelet.service.d"), 0o755)
		dropin, _ := os.ReadFile("../../deploy/examples/kubelet-dropin.conf")
		os.WriteFile(filepath.Join(dir, "kubelet.service.d", "20-cri-image-proxy.conf"), dropin, 0o644)
		verify := func() ([]byte, error) {
			cmd := exec.Command("systemd-analyze", "verify", "--man=no", "cri-image-proxy.socket", "cri-image-proxy.service", "kubelet.service")
			cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
			return cmd.CombinedOutput()
		}
		out, err := verify()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
		// It does say something of a broken unit: the check is real.
		os.WriteFile(filepath.Join(dir, "kubelet.service.d", "30-typo.conf"), []byte("[Service]\nEnviroment=X=1\n"), 0o644)
		if out, _ := verify(); !strings.Contains(string(out), "Enviroment") {
			t.Errorf("systemd-analyze verify is silent about a typo: %s", out)
		}
	})

	t.Run("systemd-analyze security rates the unit's exposure below 3", func(t *testing.T) {
		out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unit).CombinedOutput()
		_, after, ok := strings.Cut(string(out), "Overall exposure level for cri-image-proxy.service: ")
		var exposure float64
		if _, serr := fmt.Sscan(after, &exposure); err != nil || !ok || serr != nil || exposure >= 3 {
			t.Errorf("exposure %v (%v %v):\n%s", exposure, err, serr, out)
		}
		t.Logf("exposure %.1f", exposure)
	})

	t.Run("the socket unit listens where the installed config serves", func(t *testing.T) {
		data, _ := os.ReadFile(socketUnit)
		var listen string
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "ListenStream="); ok {
				listen = v
			}
		}
		out, err := exec.Command(bin, "config", "dump", "--config", cfg).CombinedOutput()
		if err != nil {
			t.Fatalf("config dump: %v\n%s", err, out)
		}
		if listen == "" || !strings.Contains(string(out), "path: "+listen+"\n") {
			t.Errorf("ListenStream=%s is not the socket.path of the installed config:\n%s", listen, out)
		}
	})

	t.Run("the unit's ExecStartPre accepts the installed config", func(t *testing.T) {
		data, _ := os.ReadFile(unit)
		var pre string
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "ExecStartPre="); ok {
				pre = v
			}
		}
		args := strings.Fields(strings.ReplaceAll(strings.ReplaceAll(pre, "/usr/local/bin/cri-image-proxy", bin), "/etc/cri-image-proxy/config.yaml", cfg))
		if len(args) < 3 || args[1] != "config" || args[2] != "validate" {
			t.Fatalf("ExecStartPre is %q, want cri-image-proxy config validate", pre)
		}
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", pre, err, out)
		}
	})

	t.Run("install again keeps the operator's config; uninstall keeps config and records", func(t *testing.T) {
		os.WriteFile(cfg, []byte("# edited\n"), 0o644)
		records := filepath.Join(root, "var/lib/cri-image-proxy/ensure.db")
		os.MkdirAll(filepath.Dir(records), 0o700)
		os.WriteFile(records, []byte("records"), 0o600)
		mk("install")
		if b, _ := os.ReadFile(cfg); string(b) != "# edited\n" {
			t.Errorf("install overwrote the config")
		}
		mk("uninstall")
		for _, gone := range []string{bin, unit, socketUnit} {
			if _, err := os.Stat(gone); !os.IsNotExist(err) {
				t.Errorf("%s left by uninstall", gone)
			}
		}
		for _, kept := range []string{cfg, records} {
			if _, err := os.Stat(kept); err != nil {
				t.Errorf("uninstall removed %s: %v", kept, err)
			}
		}
	})
}

// TestDeployManifests applies every manifest of deploy/kubernetes to the
// real kube-apiserver as a server-side dry run with strict field
// validation: the API accepts them as written.
func TestDeployManifests(t *testing.T) {
	k := needKube(t)
	dyn, err := dynamic.NewForConfig(k.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(k.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	apply := func(doc []byte) error {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return err
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		js, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		force := true
		_, err = dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Patch(context.Background(), obj.GetName(), types.ApplyPatchType, js,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "cri-image-proxy-e2e", Force: &force, FieldValidation: "Strict"})
		return err
	}
	files, _ := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if len(files) < 2 {
		t.Fatalf("manifests: %v", files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			t.Run(fmt.Sprintf("%s#%d", filepath.Base(f), i+1), func(t *testing.T) {
				if err := apply([]byte(doc)); err != nil {
					t.Errorf("the API refuses it: %v", err)
				}
			})
		}
	}
	t.Run("no manifest grants what the node's identity does not have: no role on secrets, tokens or pods, no service account token", func(t *testing.T) {
		for _, f := range files {
			data, _ := os.ReadFile(f)
			for _, doc := range strings.Split(string(data), "\n---\n") {
				var obj struct {
					Kind  string `json:"kind"`
					Rules []struct {
						Resources []string `json:"resources"`
					} `json:"rules"`
					Spec struct {
						Template struct {
							Spec struct {
								ServiceAccountName           string `json:"serviceAccountName"`
								AutomountServiceAccountToken *bool  `json:"automountServiceAccountToken"`
							} `json:"spec"`
						} `json:"template"`
					} `json:"spec"`
				}
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				for _, r := range obj.Rules {
					for _, res := range r.Resources {
						if res == "secrets" || res == "pods" || strings.HasPrefix(res, "serviceaccounts") {
							t.Errorf("%s: a %s grants %q", filepath.Base(f), obj.Kind, res)
						}
					}
				}
				if pod := obj.Spec.Template.Spec; obj.Kind == "DaemonSet" && (pod.ServiceAccountName != "" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken) {
					t.Errorf("%s: the DaemonSet's pod has a service account token (%q)", filepath.Base(f), pod.ServiceAccountName)
				}
			}
		}
	})

	t.Run("a typo is refused: the check is real", func(t *testing.T) {
		err := apply([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: kube-system}\ndatta: {a: b}\n"))
		if err == nil || !strings.Contains(err.Error(), "datta") {
			t.Errorf("got %v", err)
		}
	})
}
