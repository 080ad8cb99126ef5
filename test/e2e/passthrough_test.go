package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// fatalLine is the message crictl ends with on failure; the lines before it
// carry timestamps that differ between two runs.
var fatalLine = regexp.MustCompile(`(?m)^.*level=fatal msg="(.*)"$`)

func fatalMessage(stderr string) string {
	if m := fatalLine.FindStringSubmatch(stderr); m != nil {
		return m[1]
	}
	return stderr
}

// TestImageServiceThroughTheProxy runs the crictl image commands against
// containerd directly and through the proxy, and expects the same output.
func TestImageServiceThroughTheProxy(t *testing.T) {
	needRig(t)
	img := testRig.Registry + "/" + rig.TeamAImage
	creds := "user:" + rig.Users["user"]
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })

	t.Run("a pull without credentials fails with the registry's refusal, as without the proxy", func(t *testing.T) {
		d := crictl(t, direct(), "pull", img)
		p := crictl(t, proxied(), "pull", img)
		if d.Err == nil || p.Err == nil {
			t.Fatalf("anonymous pull of a private image succeeded: direct %v, proxied %v", d.Err, p.Err)
		}
		if refusal := registryRefusal(t, img, nil); !strings.Contains(crictlMessage(p.Stderr), refusal) {
			t.Errorf("proxied error lacks the registry's refusal %q:\n%s", refusal, p.Stderr)
		}
		if dm, pm := fatalMessage(d.Stderr), fatalMessage(p.Stderr); dm != pm {
			t.Errorf("error differs:\ndirect:  %s\nproxied: %s", dm, pm)
		}
	})

	t.Run("a pull with wrong credentials fails with the registry's refusal, as without the proxy", func(t *testing.T) {
		d := crictl(t, direct(), "pull", "--creds", "user:wrong", img)
		p := crictl(t, proxied(), "pull", "--creds", "user:wrong", img)
		refusal := registryRefusal(t, img, &runtimeapi.AuthConfig{Username: "user", Password: "wrong"})
		if p.Err == nil || !strings.Contains(crictlMessage(p.Stderr), refusal) {
			t.Fatalf("got %v, want the registry's refusal %q:\n%s", p.Err, refusal, p.Stderr)
		}
		if dm, pm := fatalMessage(d.Stderr), fatalMessage(p.Stderr); dm != pm {
			t.Errorf("error differs:\ndirect:  %s\nproxied: %s", dm, pm)
		}
	})

	t.Run("a pull with credentials succeeds", func(t *testing.T) {
		out := mustCrictl(t, proxied(), "pull", "--creds", creds, img)
		if id, ok := pulledImageID(out); !ok || id != imageID(t, img) {
			t.Errorf("unexpected output %q: want the image's ID as the runtime writes it", out)
		}
	})

	t.Run("credentials never reach the proxy's debug log", func(t *testing.T) {
		secret := rig.Users["alice"]
		mustCrictl(t, proxied(), "pull", "--creds", "alice:"+secret, img)
		crictl(t, proxied(), "pull", "--creds", "alice:"+secret+"-wrong", img)
		log := proxyProc.LogText()
		if !strings.Contains(log, "PullImage") {
			t.Fatalf("the debug log does not show the pulls; is it at debug level?")
		}
		if strings.Contains(log, secret) {
			t.Errorf("the proxy log contains a password")
		}
	})

	t.Run("images, inspecti and imagefsinfo answer as without the proxy", func(t *testing.T) {
		for _, args := range [][]string{
			{"images", "--digests"},
			{"images", "-o", "json"},
			{"inspecti", img},
			{"imagefsinfo"},
		} {
			d := mustCrictl(t, direct(), args...)
			p := mustCrictl(t, proxied(), args...)
			if args[0] == "imagefsinfo" {
				// Timestamps and usage move between two calls; compare the shape.
				d, p = stripNumbers(d), stripNumbers(p)
			}
			if d != p {
				t.Errorf("crictl %s differs:\ndirect:\n%s\nproxied:\n%s", strings.Join(args, " "), d, p)
			}
		}
		if out := mustCrictl(t, proxied(), "images"); !strings.Contains(out, testRig.Registry+"/team-a/app") {
			t.Errorf("crictl images does not list the pulled image:\n%s", out)
		}
	})

	t.Run("rmi removes the image", func(t *testing.T) {
		mustCrictl(t, proxied(), "rmi", img)
		// containerd 1.6 ignores ListImages filters: look at the whole list.
		if out := mustCrictl(t, direct(), "images"); strings.Contains(out, testRig.Registry+"/team-a/app") {
			t.Errorf("image still present:\n%s", out)
		}
		if r := crictl(t, direct(), "inspecti", img); r.Err == nil {
			t.Errorf("inspecti still finds the image")
		}
	})
}

var numbers = regexp.MustCompile(`[0-9]+`)

func stripNumbers(s string) string { return numbers.ReplaceAllString(s, "N") }

// podConfig writes a crictl pod sandbox config and returns its path.
func podConfig(t *testing.T, name, uid string, hostNetwork bool) string {
	t.Helper()
	return podConfigIn(t, "e2e", name, uid, hostNetwork)
}

// podConfigIn is podConfig of a pod in namespace.
func podConfigIn(t *testing.T, namespace, name, uid string, hostNetwork bool) string {
	t.Helper()
	logDir := filepath.Join(testRig.Dir, "pod-logs", name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": namespace, "uid": uid, "attempt": 1},
		"log_directory": logDir,
		"linux":         map[string]any{},
	}
	if hostNetwork {
		cfg["linux"] = map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}}
	} else {
		cfg["hostname"] = name
	}
	return writeJSON(t, name+"-pod.json", cfg)
}

// containerConfig writes a crictl container config running script in sh.
func containerConfig(t *testing.T, name, image, script string) string {
	t.Helper()
	return writeJSON(t, name+"-ctr.json", map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": image},
		"command":  []string{"sh", "-c", script},
		"log_path": name + ".log",
		"linux":    map[string]any{},
	})
}

// createThrough runs CreateContainer through ep (crictl create) and
// reports whether the proxy let it through: the container was created
// (ctr, which the caller removes), or the runtime itself failed the call
// just as when it is asked directly. The second is CRI-O's answer where
// containerd creates: CRI-O makes the OCI container at CreateContainer
// (runc looks up the command: an image without a shell fails), where
// containerd waits for StartContainer; and it takes no image by its ID
// alone, which it needs a name to check its signature policy by. msg is
// crictl's message when the create failed.
func createThrough(t *testing.T, ep, sandbox, ctrConfig, podConfig string) (ctr string, passed bool, msg string) {
	t.Helper()
	r := crictl(t, ep, "create", sandbox, ctrConfig, podConfig)
	if r.Err == nil {
		return strings.TrimSpace(r.Stdout), true, ""
	}
	msg = crictlMessage(r.Stderr)
	if strings.Contains(msg, "PermissionDenied") || ep == direct() {
		return "", false, msg
	}
	d := crictl(t, direct(), "create", sandbox, ctrConfig, podConfig)
	if d.Err == nil {
		crictl(t, direct(), "rm", "-f", strings.TrimSpace(d.Stdout))
		return "", false, msg + " (straight to the runtime the create succeeds)"
	}
	if dm := crictlMessage(d.Stderr); logTime.ReplaceAllString(dm, "") != logTime.ReplaceAllString(msg, "") {
		return "", false, fmt.Sprintf("%s (straight to the runtime: %s)", msg, dm)
	}
	t.Logf("the runtime itself fails the create, as straight to it: %s", msg)
	return "", true, msg
}

// logTime is the time of a log line the OCI runtime's error quotes.
var logTime = regexp.MustCompile(`time="[^"]*"`)

func writeJSON(t *testing.T, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testRig.Dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPodLifecycleThroughTheProxy runs pods and containers through the
// proxy: every RuntimeService call of crictl passes through.
func TestPodLifecycleThroughTheProxy(t *testing.T) {
	needRig(t)
	img := testRig.Registry + "/" + rig.BusyboxImage
	mustCrictl(t, proxied(), "pull", "--creds", "user:"+rig.Users["user"], img)

	for _, tc := range []struct {
		name        string
		hostNetwork bool
	}{
		{"a host-network pod runs, execs, logs and is removed", true},
		{"a pod-network pod (fake CNI) gets its own network namespace", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podName := "lifecycle-host"
			if !tc.hostNetwork {
				podName = "lifecycle-netns"
			}
			pod := podConfig(t, podName, podName+"-uid", tc.hostNetwork)
			ctr := containerConfig(t, "bb", img, "echo hello-from-container; sleep 3600")
			podID := strings.TrimSpace(mustCrictl(t, proxied(), "runp", pod))
			t.Cleanup(func() {
				crictl(t, proxied(), "stopp", podID)
				crictl(t, proxied(), "rmp", podID)
			})
			ctrID := strings.TrimSpace(mustCrictl(t, proxied(), "create", podID, ctr, pod))
			mustCrictl(t, proxied(), "start", ctrID)

			if out := mustCrictl(t, proxied(), "exec", ctrID, "sh", "-c", "echo exec-ok; id -u"); out != "exec-ok\n0\n" {
				t.Errorf("exec output %q", out)
			}
			waitUntil(t, 30*time.Second, func() error {
				if out := crictl(t, proxied(), "logs", ctrID); !strings.Contains(out.Stdout, "hello-from-container") {
					return fmt.Errorf("logs = %q %q", out.Stdout, out.Stderr)
				}
				return nil
			})
			if out := mustCrictl(t, proxied(), "ps", "-q", "--pod", podID); strings.TrimSpace(out) != ctrID {
				t.Errorf("ps lists %q, want %q", out, ctrID)
			}
			inspect := mustCrictl(t, proxied(), "inspectp", podID)
			if !tc.hostNetwork && !strings.Contains(inspect, `"ip": "`+testRig.PodAddressPrefix()) {
				t.Errorf("pod has no address of the rig's pod network (%s...):\n%s", testRig.PodAddressPrefix(), inspect)
			}
			if stats := mustCrictl(t, proxied(), "stats", "-o", "json", ctrID); !strings.Contains(stats, ctrID) {
				t.Errorf("stats lack the container: %s", stats)
			}
			mustCrictl(t, proxied(), "stop", "--timeout", "1", ctrID)
			mustCrictl(t, proxied(), "rm", ctrID)
			mustCrictl(t, proxied(), "stopp", podID)
			mustCrictl(t, proxied(), "rmp", podID)
			if out := mustCrictl(t, direct(), "pods", "-q", "--name", podName); strings.TrimSpace(out) != "" {
				t.Errorf("pod still listed: %q", out)
			}
		})
	}
}

// TestStreamsThroughTheProxy checks that the server-streaming
// GetContainerEvents answers as the runtime does: both ways open a stream,
// the test then runs a pod, and each stream must deliver that pod's events
// (containerd 2.x), or both answer with the same error (1.6 has no such
// call: Unimplemented). A stream that merely times out on both paths
// proves nothing, so a timeout fails the test.
func TestStreamsThroughTheProxy(t *testing.T) {
	needRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type stream struct {
		name   string
		events chan *runtimeapi.ContainerEventResponse
		err    chan error
	}
	open := func(name, ep string) *stream {
		conn, err := rig.DialCRI(ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		s := &stream{name: name, events: make(chan *runtimeapi.ContainerEventResponse, 64), err: make(chan error, 1)}
		c, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
		if err != nil {
			s.err <- err
			return s
		}
		go func() {
			for {
				ev, err := c.Recv()
				if err != nil {
					s.err <- err
					return
				}
				s.events <- ev
			}
		}()
		return s
	}
	streams := []*stream{open("direct", direct()), open("proxied", proxied())}

	// An error straight away (Unimplemented on 1.6) must be the same both ways.
	time.Sleep(time.Second)
	var codesSeen []string
	for _, s := range streams {
		select {
		case err := <-s.err:
			st := status.Convert(err)
			codesSeen = append(codesSeen, st.Code().String()+" "+st.Message())
		default:
		}
	}
	switch len(codesSeen) {
	case 2:
		if codesSeen[0] != codesSeen[1] {
			t.Fatalf("GetContainerEvents: direct %s, proxied %s", codesSeen[0], codesSeen[1])
		}
		t.Logf("GetContainerEvents answers %s both ways", codesSeen[0])
		return
	case 1:
		t.Fatalf("GetContainerEvents failed on one path only: %s", codesSeen[0])
	}

	// Both streams are open: cause events.
	pod := podConfig(t, "events", "events-uid", true)
	podID := strings.TrimSpace(mustCrictl(t, direct(), "runp", pod))
	mustCrictl(t, direct(), "stopp", podID)
	mustCrictl(t, direct(), "rmp", podID)
	want := map[runtimeapi.ContainerEventType]bool{}
	for i, s := range streams {
		seen := map[runtimeapi.ContainerEventType]bool{}
		for !seen[runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT] {
			select {
			case ev := <-s.events:
				if ev.GetContainerId() == podID {
					seen[ev.GetContainerEventType()] = true
				}
			case err := <-s.err:
				t.Fatalf("%s stream ended before the pod's events: %v (seen %v)", s.name, err, seen)
			case <-ctx.Done():
				t.Fatalf("%s stream: no deleted event for pod %s (seen %v)", s.name, podID, seen)
			}
		}
		if i == 0 {
			want = seen
		} else if fmt.Sprint(seen) != fmt.Sprint(want) {
			t.Errorf("event types differ: direct %v, proxied %v", want, seen)
		}
		t.Logf("%s stream: pod %s events %v", s.name, podID[:12], seen)
	}
}

// TestListStreamsAnswerAsTheRuntimeDoes: containerd 2.4 serves
// server-streaming variants of the CRI list calls (StreamPodSandboxes,
// StreamContainers, StreamImages; cri-api 0.36), which 2.3 and 1.6 answer
// Unimplemented. Through the proxy each answers as directly: the same code,
// and where the runtime streams, the same pods, containers and images, among
// them the ones the test made first (so that an empty answer both ways
// cannot pass).
func TestListStreamsAnswerAsTheRuntimeDoes(t *testing.T) {
	needRig(t)
	img := testRig.AnonRegistry + "/" + rig.BusyboxImage
	mustCrictl(t, direct(), "pull", img)
	conn, err := rig.DialCRI(direct())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := runtimeapi.NewImageServiceClient(conn).ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
	if err != nil || st.GetImage() == nil {
		t.Fatalf("ImageStatus %s: %v (present: %v)", img, err, st.GetImage() != nil)
	}
	imageID := st.GetImage().GetId()
	pod := podConfig(t, "liststreams", "liststreams-uid", true)
	podID := strings.TrimSpace(mustCrictl(t, direct(), "runp", pod))
	t.Cleanup(func() {
		crictl(t, direct(), "stopp", podID)
		crictl(t, direct(), "rmp", podID)
	})
	ctrID := strings.TrimSpace(mustCrictl(t, direct(), "create", podID, containerConfig(t, "liststreams", img, "sleep 60"), pod))

	// drain reads a stream to its end: the IDs it listed, sorted, or the
	// code and message it ended with.
	drain := func(recv func() ([]string, error)) (ids []string, ended string) {
		for {
			batch, err := recv()
			if err == io.EOF {
				sort.Strings(ids)
				return ids, ""
			}
			if err != nil {
				st := status.Convert(err)
				return nil, st.Code().String() + ": " + st.Message()
			}
			ids = append(ids, batch...)
		}
	}
	calls := []struct {
		name string
		made string
		list func(ctx context.Context, conn *grpc.ClientConn) (recv func() ([]string, error), err error)
	}{
		{"StreamPodSandboxes", podID, func(ctx context.Context, conn *grpc.ClientConn) (func() ([]string, error), error) {
			c, err := runtimeapi.NewRuntimeServiceClient(conn).StreamPodSandboxes(ctx, &runtimeapi.StreamPodSandboxesRequest{})
			return func() ([]string, error) {
				r, err := c.Recv()
				var ids []string
				for _, p := range r.GetPodSandboxes() {
					ids = append(ids, p.GetId())
				}
				return ids, err
			}, err
		}},
		{"StreamContainers", ctrID, func(ctx context.Context, conn *grpc.ClientConn) (func() ([]string, error), error) {
			c, err := runtimeapi.NewRuntimeServiceClient(conn).StreamContainers(ctx, &runtimeapi.StreamContainersRequest{})
			return func() ([]string, error) {
				r, err := c.Recv()
				var ids []string
				for _, c := range r.GetContainers() {
					ids = append(ids, c.GetId())
				}
				return ids, err
			}, err
		}},
		{"StreamImages", imageID, func(ctx context.Context, conn *grpc.ClientConn) (func() ([]string, error), error) {
			c, err := runtimeapi.NewImageServiceClient(conn).StreamImages(ctx, &runtimeapi.StreamImagesRequest{})
			return func() ([]string, error) {
				r, err := c.Recv()
				var ids []string
				for _, i := range r.GetImages() {
					ids = append(ids, i.GetId())
				}
				return ids, err
			}, err
		}},
	}
	for _, call := range calls {
		t.Run(call.name, func(t *testing.T) {
			var ids [2][]string
			var ended [2]string
			for i, ep := range []string{direct(), proxied()} {
				conn, err := rig.DialCRI(ep)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				recv, err := call.list(ctx, conn)
				if err != nil {
					recv = func() ([]string, error) { return nil, err }
				}
				ids[i], ended[i] = drain(recv)
			}
			if ended[0] != ended[1] {
				t.Fatalf("direct ended %q, proxied %q", ended[0], ended[1])
			}
			if ended[0] != "" {
				t.Logf("%s answers %s both ways", testRig.Runtime.Name, ended[0])
				return
			}
			if !slices.Contains(ids[0], call.made) {
				t.Fatalf("the runtime's stream lacks %s, which the test made: %v", call.made, ids[0])
			}
			if !slices.Equal(ids[0], ids[1]) {
				t.Errorf("listed differently:\ndirect:  %v\nproxied: %v", ids[0], ids[1])
			}
			t.Logf("%s streams %d both ways", testRig.Runtime.Name, len(ids[0]))
		})
	}
}

// waitUntil polls f until it succeeds or the bound passes: a bound, not a
// performance assertion.
func waitUntil(t *testing.T, bound time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", bound, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
