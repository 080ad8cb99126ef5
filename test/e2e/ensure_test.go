package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// ensureProxy is a proxy with KEP-2535 enforcement, its database and
// admin socket in the rig's directory.
type ensureProxy struct {
	ep, sock, db, admin string
	proc                *rig.Proc
	args                []string
}

func startEnsureProxy(t *testing.T, name string, extra ...string) *ensureProxy {
	t.Helper()
	dir := filepath.Join(testRig.Dir, "ensure-"+name)
	p := &ensureProxy{sock: filepath.Join(testRig.Dir, name+".sock"), db: filepath.Join(dir, "ensure.db"), admin: filepath.Join(dir, "admin.sock")}
	p.ep = "unix://" + p.sock
	p.args = append([]string{"--ensure-secret-pulled-images", "--ensure-database", p.db, "--admin-socket", p.admin}, extra...)
	p.start(t)
	t.Cleanup(func() { p.proc.Stop(10 * time.Second) })
	return p
}

func (p *ensureProxy) start(t *testing.T) {
	t.Helper()
	var err error
	if p.proc, err = testRig.StartProxy(proxyBin, p.sock, p.args...); err != nil {
		t.Fatal(err)
	}
}

// records runs cri-image-proxy records against this proxy.
func (p *ensureProxy) records(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(proxyBin, append(append([]string{"records"}, args...),
		"--admin-socket", p.admin, "--database", p.db, "--runtime-endpoint", direct())...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// tenant is a pod of a tenant, as crictl describes it with --pod-config.
type tenant struct {
	name, uid, creds string
	config           string
}

func newTenant(t *testing.T, name, creds string) tenant {
	return tenant{name: name, uid: name + "-uid", creds: creds, config: podConfig(t, name, name+"-uid", true)}
}

// pull is the kubelet's IfNotPresent sequence through crictl: ImageStatus
// (inspecti), then PullImage with the pod's sandbox config and credentials
// when the image was not shown.
func (tn tenant) pull(t *testing.T, ep, image string) rig.Result {
	t.Helper()
	if r := crictl(t, ep, "inspecti", image); r.Err == nil {
		return rig.Result{Stdout: "present"}
	}
	args := []string{"pull", "--pod-config", tn.config}
	if tn.creds != "" {
		args = append(args, "--creds", tn.creds)
	}
	return crictl(t, ep, append(args, image)...)
}

// pullCountingRequests pulls as tn and returns how many requests the
// registry answered meanwhile: 0 is a re-use from the node.
func (tn tenant) pullCountingRequests(t *testing.T, ep, image string) int {
	t.Helper()
	return len(requestsDuring(t, testRig.Registry, func() {
		if r := tn.pull(t, ep, image); r.Err != nil {
			t.Fatalf("%s pulling %s: %v\n%s", tn.name, image, r.Err, r.Stderr)
		}
	}))
}

func TestEnsureSecretPulledImages(t *testing.T) {
	needRig(t)
	p := startEnsureProxy(t, "ensure")
	img := testRig.Registry + "/" + rig.TeamAImage
	crictl(t, direct(), "rmi", img)
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })

	alice := newTenant(t, "tenant-a", "alice:"+rig.Users["alice"])
	alice2 := newTenant(t, "tenant-a2", "alice:"+rig.Users["alice"])
	bob := newTenant(t, "tenant-b", "")
	bobWrong := newTenant(t, "tenant-b-wrong", "bob:wrong")
	bobOwn := newTenant(t, "tenant-b-own", "bob:"+rig.Users["bob"])
	bobOwn2 := newTenant(t, "tenant-b-own2", "bob:"+rig.Users["bob"])

	t.Run("tenant A pulls the private image with its credentials", func(t *testing.T) {
		if r := alice.pull(t, p.ep, img); r.Err != nil {
			t.Fatalf("%v\n%s", r.Err, r.Stderr)
		}
	})

	t.Run("tenant B without credentials is not shown the image, and fails at the registry", func(t *testing.T) {
		if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
			t.Errorf("ImageStatus showed B a verified-only image:\n%s", r.Stdout)
		}
		if r := crictl(t, direct(), "inspecti", img); r.Err != nil {
			t.Fatalf("the image is not on the node: %s", r.Stderr)
		}
		r := bob.pull(t, p.ep, img)
		if r.Err == nil || !strings.Contains(crictlMessage(r.Stderr), registryRefusal(t, img, nil)) {
			t.Errorf("B's pull: %v\n%s", r.Err, r.Stderr)
		}
	})

	t.Run("tenant B with wrong credentials fails at the registry", func(t *testing.T) {
		r := bobWrong.pull(t, p.ep, img)
		user, pass, _ := strings.Cut(bobWrong.creds, ":")
		if r.Err == nil || !strings.Contains(crictlMessage(r.Stderr), registryRefusal(t, img, &runtimeapi.AuthConfig{Username: user, Password: pass})) {
			t.Errorf("%v\n%s", r.Err, r.Stderr)
		}
	})

	t.Run("a container of B started by another route is refused at CreateContainer", func(t *testing.T) {
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", bob.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		ctr := containerConfig(t, "b-ctr", img, "true")
		r := crictl(t, p.ep, "create", podID, ctr, bob.config)
		if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") || !strings.Contains(r.Stderr, img) || !strings.Contains(r.Stderr, bob.uid) {
			t.Errorf("create: %v\n%s", r.Err, r.Stderr)
		}
	})

	t.Run("tenant A's other pod re-uses the image with zero registry requests, and may create its container", func(t *testing.T) {
		if n := alice2.pullCountingRequests(t, p.ep, img); n != 0 {
			t.Errorf("%d registry requests for a verified re-use, want 0", n)
		}
		podID := strings.TrimSpace(mustCrictl(t, p.ep, "runp", alice2.config))
		defer func() { crictl(t, p.ep, "stopp", podID); crictl(t, p.ep, "rmp", podID) }()
		ctr := containerConfig(t, "a2-ctr", img, "true")
		if _, passed, msg := createThrough(t, p.ep, podID, ctr, alice2.config); !passed {
			t.Errorf("create: %s", msg)
		}
	})

	t.Run("tenant B with its own valid credentials verifies once, then re-uses", func(t *testing.T) {
		if bobOwn.pullCountingRequests(t, p.ep, img) == 0 {
			t.Errorf("B's own credentials were not checked at the registry")
		}
		if n := bobOwn2.pullCountingRequests(t, p.ep, img); n != 0 {
			t.Errorf("%d registry requests, want 0", n)
		}
	})

	t.Run("records survive a proxy restart", func(t *testing.T) {
		p.proc.Stop(10 * time.Second)
		p.start(t)
		if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
			t.Errorf("after a restart the image is shown to anyone")
		}
		if n := alice.pullCountingRequests(t, p.ep, img); n != 0 {
			t.Errorf("%d registry requests after a restart, want 0", n)
		}
	})

	t.Run("records list, show and explain while the daemon runs", func(t *testing.T) {
		out, err := p.records(t, "list")
		if err != nil || !strings.Contains(out, "127.0.0.1") || !strings.Contains(out, "team-a/app") || !strings.Contains(out, "1 record(s)") {
			t.Errorf("list: %v\n%s", err, out)
		}
		out, err = p.records(t, "explain", img, "--pod-uid", bob.uid)
		if err != nil || !strings.Contains(out, "granted=false") || !strings.Contains(out, "must pull it with a credential") {
			t.Errorf("explain for B: %v\n%s", err, out)
		}
		// Grants live in memory: after the restart only A's pull above granted.
		out, err = p.records(t, "explain", img, "--pod-uid", alice.uid)
		if err != nil || !strings.Contains(out, "granted=true") {
			t.Errorf("explain for A: %v\n%s", err, out)
		}
		out, err = p.records(t, "show", img)
		var rec map[string]any
		if err != nil || json.Unmarshal([]byte(out), &rec) != nil || rec["kind"] != "ImagePulledRecord" {
			t.Errorf("show: %v\n%s", err, out)
		}
	})

	t.Run("no password reaches the database, the records or the log", func(t *testing.T) {
		db, err := os.ReadFile(p.db)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := p.records(t, "export")
		for _, secret := range []string{rig.Users["alice"], rig.Users["bob"]} {
			if strings.Contains(string(db), secret) || strings.Contains(out, secret) || strings.Contains(p.proc.LogText(), secret) {
				t.Errorf("a password is stored or logged")
			}
		}
		if fi, _ := os.Stat(p.db); fi.Mode().Perm() != 0o600 {
			t.Errorf("database mode %v", fi.Mode().Perm())
		}
	})

	t.Run("revoking the image makes every pod verify again", func(t *testing.T) {
		if out, err := p.records(t, "revoke", "--image", img); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if alice2.pullCountingRequests(t, p.ep, img) == 0 {
			t.Errorf("after revoke, A re-used the image without the registry")
		}
	})

	t.Run("RemoveImage clears the record", func(t *testing.T) {
		// By ID: by name crictl asks ImageStatus first, which hides it (the
		// kubelet's image GC removes by ID too).
		id := strings.TrimSpace(mustCrictl(t, direct(), "inspecti", "-o", "go-template", "--template", "{{.status.id}}", img))
		mustCrictl(t, p.ep, "rmi", id)
		out, err := p.records(t, "list")
		if err != nil || !strings.Contains(out, "0 record(s)") {
			t.Errorf("%v\n%s", err, out)
		}
	})
}

func TestEnsurePublicImagesAreNeverHidden(t *testing.T) {
	needRig(t)
	p := startEnsureProxy(t, "ensure-public")
	// The anonymous view of the registry: a public image.
	img := testRig.AnonRegistry + "/" + rig.TeamBImage
	crictl(t, direct(), "rmi", img)
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	anyone := newTenant(t, "public-1", "")
	if r := anyone.pull(t, p.ep, img); r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Stderr)
	}
	for i := 0; i < 3; i++ {
		if r := crictl(t, p.ep, "inspecti", img); r.Err != nil {
			t.Errorf("an anonymously pulled image is hidden: %s", r.Stderr)
		}
	}
	out, _ := p.records(t, "list")
	if !strings.Contains(out, "true") {
		t.Errorf("the record is not node-wide:\n%s", out)
	}
	if out, err := p.records(t, "gc"); err != nil || !strings.Contains(out, "dropped 0 record(s)") {
		t.Errorf("gc through the daemon: %v\n%s", err, out)
	}

	// With the daemon stopped, the commands open the file directly: the
	// reading ones read-only.
	p.proc.Stop(10 * time.Second)
	before, _ := os.ReadFile(p.db)
	out, err := p.records(t, "list")
	if err != nil || !strings.Contains(out, "team-b/app") || !strings.Contains(out, "1 record(s)") {
		t.Errorf("list from the file: %v\n%s", err, out)
	}
	out, err = p.records(t, "explain", img, "--pod-uid", "someone")
	if err != nil || !strings.Contains(out, "any pod may use it") || !strings.Contains(out, "the daemon does not run") {
		t.Errorf("explain from the file: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(p.db); string(after) != string(before) {
		t.Errorf("list and explain changed the database file")
	}
	missing := filepath.Join(t.TempDir(), "no", "ensure.db")
	res, err := exec.Command(proxyBin, "records", "list", "--admin-socket", p.admin+".none", "--database", missing).CombinedOutput()
	if err == nil || !strings.Contains(string(res), "no records database at "+missing) {
		t.Errorf("records list on a missing database: %v\n%s", err, res)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("records list created the missing database (%v)", err)
	}
	p.start(t)
}

// TestEnsureKill9MidPull kills the proxy with SIGKILL while pulls are in
// flight, several times: afterwards every image that came onto the node
// through it is still hidden from a pod without credentials, whatever
// moment the kill hit (a record, or an intent settled at start). An intent
// whose image is not on the node is kept (its repository still counts as a
// pull in flight) until a pull of that image through the proxy settles it.
//
// Each kill is timed from the pulls' progress, not from when crictl
// started (crictl takes longer to connect than a short sleep): the first
// round kills at the registry's first request, so every pull is cut off;
// the middle ones some time after it; the last one once an image is on
// the node, so at least one image landed through the proxy.
func TestEnsureKill9MidPull(t *testing.T) {
	needRig(t)
	p := startEnsureProxy(t, "ensure-kill")
	images := []string{rig.TeamAImage, rig.TeamBImage, rig.BusyboxImage, "k8s-staging-cri-tools/test-image-1:latest", "k8s-staging-cri-tools/test-image-2:latest", "k8s-staging-cri-tools/test-image-3:latest"}
	for i := range images {
		images[i] = testRig.Registry + "/" + images[i]
		crictl(t, direct(), "rmi", images[i])
	}
	t.Cleanup(func() { crictl(t, direct(), append([]string{"rmi"}, images...)...) })
	tn := newTenant(t, "kill-a", "alice:"+rig.Users["alice"])
	conn, err := rig.DialCRI(direct())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	runtimeImages := runtimeapi.NewImageServiceClient(conn)
	onNode := func() int {
		n := 0
		for _, img := range images {
			r, err := runtimeImages.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
			if err == nil && r.Image != nil {
				n++
			}
		}
		return n
	}

	const lastRound = -1 // kill once an image is on the node
	delays := []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, lastRound}
	cutOff, landed := 0, 0
	for round, delay := range delays {
		// A pull an earlier kill cut off may still be running in
		// containerd and put its image back after an rmi: remove until
		// the node holds none (bounded), so that this round's pulls go to
		// the registry.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			for _, img := range images {
				crictl(t, direct(), "rmi", img)
			}
			if onNode() == 0 || time.Now().After(deadline) {
				break
			}
		}
		requestsBefore := registryRequests(t)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var pulls []string // how each pull of the round ended, for a failure's message
		for _, img := range images {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := crictl(t, p.ep, "pull", "--pod-config", tn.config, "--creds", tn.creds, img)
				mu.Lock()
				pulls = append(pulls, fmt.Sprintf("%s: %v %s", img, r.Err, strings.TrimSpace(r.Stderr)))
				mu.Unlock()
			}()
		}
		// allEnded: every pull of the round ended. Should an image come
		// back after the rmi all the same, its pull is answered from the
		// node with no registry request; the kill then cuts nothing, and
		// the round still checks that nothing is shown.
		allEnded := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(pulls) == len(images)
		}
		until := func(what string, cond func() bool) {
			for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					mu.Lock()
					ended := strings.Join(pulls, "\n")
					mu.Unlock()
					t.Fatalf("round %d: %s did not happen within 30s; the pulls that ended:\n%s\nthe proxy's last lines:\n%s", round, what, ended, tail(p.proc.LogText(), 40))
				}
			}
		}
		until("a pull reaching the registry", func() bool { return registryRequests(t) > requestsBefore || allEnded() })
		if delay == lastRound {
			until("an image landing on the node", func() bool { return onNode() > 0 || allEnded() })
		} else {
			time.Sleep(delay)
		}
		p.proc.Signal(syscall.SIGKILL)
		<-p.proc.Exited()
		wg.Wait()
		p.start(t)
		// containerd may finish a pull the kill cut off after the restart's
		// settle looked: a GC run settles such an intent too.
		if out, err := p.records(t, "gc"); err != nil {
			t.Fatalf("round %d: records gc: %v\n%s", round, err, out)
		}
		for _, in := range intentsLeft(t, p) {
			if r := crictl(t, direct(), "inspecti", in.Image); r.Err == nil {
				t.Errorf("round %d: the intent for %s was kept although its image is on the node", round, in.Image)
			}
		}
		present := 0
		for _, img := range images {
			if r := crictl(t, direct(), "inspecti", img); r.Err != nil {
				continue // the kill came before the runtime had it
			}
			present++
			if r := crictl(t, p.ep, "inspecti", img); r.Err == nil {
				t.Errorf("round %d: %s came through the proxy and is now shown to anyone", round, img)
			}
		}
		if present < len(images) {
			cutOff++
		}
		landed += present
		out, _ := p.records(t, "list")
		when := fmt.Sprintf("%v after the first registry request", delay)
		if delay == lastRound {
			when = "once an image was on the node"
		}
		t.Logf("round %d (kill %s): %d of %d images on the node, all hidden\n%s", round, when, present, len(images), out)
	}
	if cutOff == 0 || landed == 0 {
		t.Errorf("the kills cut off pulls in %d round(s) and let %d image(s) land: the test needs both", cutOff, landed)
	}

	// A pull of each image that ends, however it ends, settles its kept intents.
	for _, img := range images {
		crictl(t, p.ep, "pull", "--pod-config", tn.config, "--creds", tn.creds, img)
	}
	if left := intentsLeft(t, p); len(left) > 0 {
		t.Errorf("intents left after a pull of each image through the proxy: %v", left)
	}
}

// intentsLeft is the pull intents in the proxy's database.
func intentsLeft(t *testing.T, p *ensureProxy) []ensure.Intent {
	t.Helper()
	out, err := p.records(t, "export")
	if err != nil {
		t.Fatalf("records export: %v\n%s", err, out)
	}
	var ex struct{ Intents []ensure.Intent }
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("records export is not JSON: %v\n%s", err, out)
	}
	return ex.Intents
}
