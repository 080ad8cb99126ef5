package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/kubeletrecords"
)

var kubeletFormatScenario = nodeScenario{
	name:   "records in the kubelet's format: its records imported (secrets left behind); the proxy's exported and honoured by the kubelet alone",
	needs:  []nodeNeed{kubeletRecords},
	images: []string{"migrate:v1"},
	run:    (*nodeEnv).scenarioKubeletFormat,
}

// scenarioKubeletFormat: a node moves its KEP-2535 records between the
// proxy and a kubelet that keeps its own (the current kubelet with its
// feature on; n/a for the others, which keep none).
//
// Export, honoured by the kubelet alone: an image A pulled with its secret
// through the proxy; the kubelet's own record of it is deleted and the
// kubelet moved onto containerd directly (the proxy out of the path). As a
// control, B's Never pod without a secret then runs A's image (the kubelet
// takes it for preloaded). With the proxy's records exported into its
// directory, the same pod gets ErrImageNeverPull, while A's Never pod runs
// with no registry request: the kubelet matched A's secret by the
// coordinates the proxy exported, and wrote its own hash.
//
// Import: the kubelet's records, as it wrote them, go into a new
// database; its secrets' hashes cannot cross and are counted, the images
// stay "pulled with credentials".
func (e *nodeEnv) scenarioKubeletFormat(t *testing.T) {
	imageManager := filepath.Join(e.node.RootDir(), "image_manager")
	work := t.TempDir()
	noDaemon := filepath.Join(work, "no-daemon.sock")
	proxyCmd := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(proxyBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("cri-image-proxy %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	t.Run("export, honoured by the kubelet without the proxy", func(t *testing.T) {
		image := e.image("migrate:v1")
		e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "migrate-a", image: image, policy: corev1.PullIfNotPresent, secret: "regcred"}))
		id := strings.TrimSpace(mustCrictl(t, direct(), "inspecti", "-o", "go-template", "--template", "{{.status.id}}", image))
		kubeletFile := filepath.Join(imageManager, kubeletrecords.PulledDir, kubeletrecords.FileName(id))
		back := func() {
			e.node.Pause()
			if err := e.node.Resume(e.proxy.ep); err != nil {
				t.Fatalf("the kubelet back on the proxy: %v", err)
			}
		}

		// The kubelet alone, without its record of the image: the control.
		e.node.Pause()
		if err := os.Remove(kubeletFile); err != nil {
			t.Fatalf("the kubelet kept no record of A's pull: %v", err)
		}
		if err := e.node.Resume(direct()); err != nil {
			t.Fatal(err)
		}
		defer back()
		leak := e.run(t, podSpec{ns: e.nsB, name: "migrate-b-before", image: image, policy: corev1.PullNever})
		e.waitRunning(t, leak)
		t.Logf("control: with no record, the kubelet alone runs A's image for B (taken for preloaded)")
		zero := int64(0)
		e.k.Admin.CoreV1().Pods(leak.Namespace).Delete(context.Background(), leak.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		e.waitGone(t, leak)

		// The proxy's records exported into the kubelet's directory.
		e.node.Pause()
		out := proxyCmd("records", "export", "--format", "kubelet", imageManager, "--admin-socket", e.proxy.admin, "--runtime-endpoint", direct())
		t.Logf("%s", out)
		data, err := os.ReadFile(kubeletFile)
		if err != nil {
			t.Fatalf("no exported record of the image: %v", err)
		}
		rec, err := kubeletrecords.DecodeRecord(data)
		if err != nil {
			t.Fatal(err)
		}
		if s := rec.CredentialMapping[strings.TrimSuffix(image, ":v1")].KubernetesSecrets; len(s) != 1 || s[0].Name != "regcred" || s[0].CredentialHash != "" {
			t.Fatalf("the exported record's secrets: %+v, want regcred by its coordinates, no hash", s)
		}
		if err := e.node.Resume(""); err != nil {
			t.Fatal(err)
		}
		b := e.run(t, podSpec{ns: e.nsB, name: "migrate-b-after", image: image, policy: corev1.PullNever})
		e.waitWaiting(t, b, "ErrImageNeverPull")
		e.neverRan(t, b)
		if _, n := e.runCounting(t, podSpec{ns: e.nsA, name: "migrate-a-never", image: image, policy: corev1.PullNever, secret: "regcred"}, image); n != 0 {
			t.Errorf("%d registry requests for A's Never pod", n)
		}
		data, _ = os.ReadFile(kubeletFile)
		if rec, err := kubeletrecords.DecodeRecord(data); err != nil || len(rec.CredentialMapping[strings.TrimSuffix(image, ":v1")].KubernetesSecrets) != 1 ||
			rec.CredentialMapping[strings.TrimSuffix(image, ":v1")].KubernetesSecrets[0].CredentialHash == "" {
			t.Errorf("the kubelet did not write its own hash for regcred at the match: %s (%v)", data, err)
		}
	})
	t.Run("import", func(t *testing.T) {
		db := filepath.Join(work, "imported.db")
		out := proxyCmd("records", "import", "--format", "kubelet", imageManager, "--database", db, "--create", "--admin-socket", noDaemon)
		t.Logf("%s", out)
		m := regexp.MustCompile(`imported (\d+) record\(s\)`).FindStringSubmatch(out)
		if m == nil || m[1] == "0" {
			t.Fatalf("nothing imported from the kubelet's records:\n%s", out)
		}
		if !strings.Contains(out, "pull secret credential(s) of the kubelet were not carried") {
			t.Errorf("the kubelet's secrets (A's regcred at least) are not reported as left behind:\n%s", out)
		}
		var ex struct {
			Records []kubeletrecords.Record `json:"records"`
		}
		if err := json.Unmarshal([]byte(proxyCmd("records", "export", "--database", db, "--admin-socket", noDaemon)), &ex); err != nil {
			t.Fatal(err)
		}
		migrated := strings.TrimSuffix(e.image("migrate:v1"), ":v1")
		found := false
		for _, r := range ex.Records {
			for repo, c := range r.CredentialMapping {
				if len(c.KubernetesSecrets) > 0 {
					t.Errorf("%s %s: a secret crossed: %+v", r.ImageRef, repo, c.KubernetesSecrets)
				}
				found = found || repo == migrated
			}
		}
		if !found {
			t.Errorf("no imported record for %s (the kubelet's, with A's secret)", migrated)
		}
	})
}
