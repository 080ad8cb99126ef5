package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestEnsureDatabaseThatCannotBeOpened starts the proxy on a records
// database it cannot open (garbage where the file was): it still serves
// the runtime, but fails closed, and says why to the operator only. With
// the file restored from a backup and a restart, the records are back.
func TestEnsureDatabaseThatCannotBeOpened(t *testing.T) {
	needRig(t)
	mon := freeAddr(t)
	p := startEnsureProxy(t, "ensure-degraded", "--monitoring-address", mon)
	img := testRig.Registry + "/" + rig.TeamAImage
	crictl(t, direct(), "rmi", img)
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	alice := newTenant(t, "degraded-a", "alice:"+rig.Users["alice"])
	alice2 := newTenant(t, "degraded-a2", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "degraded-b", "")
	if r := alice.pull(t, p.ep, img); r.Err != nil {
		t.Fatalf("A's pull: %v\n%s", r.Err, r.Stderr)
	}
	p.proc.Stop(10 * time.Second)
	backup := p.db + ".backup"
	data, err := os.ReadFile(p.db)
	if err != nil {
		t.Fatal(err)
	}
	const garbage = "this is not a records database"
	if err := os.WriteFile(backup, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.db, []byte(strings.Repeat(garbage+"\n", 2000)), 0o600); err != nil {
		t.Fatal(err)
	}
	p.start(t)

	t.Run("the runtime is still served", func(t *testing.T) {
		if r := crictl(t, p.ep, "version"); r.Err != nil {
			t.Fatalf("crictl version: %v\n%s", r.Err, r.Stderr)
		}
		if c := recordsCondition(t, p.ep); c == nil || c.Status || c.Reason != "RecordsDatabaseUnavailable" {
			t.Errorf("crictl info shows the records condition %+v, want false", c)
		}
		if code, body := httpGet(t, mon, "/readyz"); code != 503 || !strings.Contains(body, "records database") {
			t.Errorf("readyz: %d %q, want 503 naming the records database", code, body)
		}
		_, metrics := httpGet(t, mon, "/metrics")
		for _, want := range []string{"cri_image_proxy_backend_up 1", "cri_image_proxy_ensure_records_available 0"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("the image A verified is hidden from everyone, and no pull can be recorded", func(t *testing.T) {
		if r := crictl(t, direct(), "inspecti", img); r.Err != nil {
			t.Fatalf("the image is not on the node: %s", r.Stderr)
		}
		if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
			t.Errorf("ImageStatus showed the image with the records unavailable")
		}
		requests := requestsDuring(t, testRig.Registry, func() {
			for _, tn := range []tenant{alice2, bob} {
				r := tn.pull(t, p.ep, img)
				if r.Err == nil || !strings.Contains(r.Stderr, "Unavailable") || strings.Contains(r.Stderr, garbage) || strings.Contains(r.Stderr, p.db) {
					t.Errorf("%s's pull: %v, want Unavailable without the cause\n%s", tn.name, r.Err, r.Stderr)
				}
			}
		})
		if n := len(requests); n != 0 {
			t.Errorf("%d registry requests for refused pulls, want 0", n)
		}
	})

	t.Run("a container from the image is refused", func(t *testing.T) {
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", alice2.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		r := crictl(t, p.ep, "create", podID, containerConfig(t, "degraded-ctr", img, "true"), alice2.config)
		if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") {
			t.Errorf("create: %v\n%s", r.Err, r.Stderr)
		}
	})

	t.Run("the log tells the operator what is wrong and what to do", func(t *testing.T) {
		log, err := os.ReadFile(p.proc.Log)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"the records database cannot be opened", p.db, "Restore the file from a backup"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("the log lacks %q", want)
			}
		}
	})

	t.Run("restored from the backup and restarted, the records are back", func(t *testing.T) {
		p.proc.Stop(10 * time.Second)
		if err := os.Rename(backup, p.db); err != nil {
			t.Fatal(err)
		}
		p.start(t)
		if code, body := httpGet(t, mon, "/readyz"); code != 200 {
			t.Errorf("readyz: %d %q", code, body)
		}
		if c := recordsCondition(t, p.ep); c == nil || !c.Status {
			t.Errorf("crictl info shows the records condition %+v, want true", c)
		}
		if n := alice2.pullCountingRequests(t, p.ep, img); n != 0 {
			t.Errorf("%d registry requests for A's verified re-use, want 0", n)
		}
		if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
			t.Errorf("the image is shown to B")
		}
	})
}

// condition is a runtime condition as crictl info prints it.
type condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// recordsCondition is the proxy's records condition in crictl info at ep,
// nil when it has none; the runtime's own conditions must be there too.
func recordsCondition(t *testing.T, ep string) *condition {
	t.Helper()
	var info struct {
		Status struct {
			Conditions []condition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(mustCrictl(t, ep, "info")), &info); err != nil {
		t.Fatalf("crictl info: %v", err)
	}
	var found *condition
	types := map[string]bool{}
	for i, c := range info.Status.Conditions {
		types[c.Type] = true
		if c.Type == ensure.RecordsCondition {
			found = &info.Status.Conditions[i]
		}
	}
	if !types["RuntimeReady"] || !types["NetworkReady"] {
		t.Errorf("crictl info through the proxy lost the runtime's conditions: %v", info.Status.Conditions)
	}
	return found
}
