package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestCutPullsLeaveNothingOpen (threat 20 of docs/threat-model.md): many private pulls
// through the proxy, each of a fresh image and each cut by its client's
// deadline, the deadlines spread around one pull's length (measured
// first), so that the runtime has finished some when the client goes away
// and not others. Afterwards every image the runtime holds, asked
// directly, is hidden from a tenant without credentials and refused at
// its CreateContainer by name and by ID, before a GC run and after it; the
// puller pulls again (verified at the registry where its pull was cut) and
// then re-uses with no registry request. The cuts that came after the
// image arrived, the case that used to leave the image untracked, are
// counted and reported. (The runtime goes on with a pull after its client
// went away and may create the image after the proxy asked what the pull
// left: found here, on both runtimes.)
func TestCutPullsLeaveNothingOpen(t *testing.T) {
	needRig(t)
	const repoPrefix = "cut-"
	images := newFreshImages(t, repoPrefix)
	push := images.push

	p := startEnsureProxy(t, "cut-pulls")
	proxy := mustDial(t, p.ep)
	proxyImages := runtimeapi.NewImageServiceClient(proxy)
	runtimeImages := runtimeapi.NewImageServiceClient(mustDial(t, direct()))
	alice := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}
	alicePod := sandboxConfig(t, "cut-alice", "cut-alice-uid")
	pull := func(ctx context.Context, image string, pod *runtimeapi.PodSandboxConfig) error {
		_, err := proxyImages.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: alice, SandboxConfig: pod})
		return err
	}
	onNode := func(image string) (string, bool) {
		st, err := runtimeImages.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
		if err != nil || st.GetImage() == nil {
			return "", false
		}
		return st.Image.Id, true
	}

	// One pull's length, through the proxy, as the cut pulls will run: the
	// busybox layer they share already on the node (the warm-up's).
	warm := push("warm")
	if err := pull(context.Background(), warm, alicePod); err != nil {
		t.Fatalf("warm-up pull: %v", err)
	}
	var lengths []time.Duration
	for i := range 3 {
		img := push(fmt.Sprintf("measure-%d", i))
		start := time.Now()
		if err := pull(context.Background(), img, alicePod); err != nil {
			t.Fatalf("measured pull: %v", err)
		}
		lengths = append(lengths, time.Since(start))
	}
	slices.Sort(lengths)
	length := lengths[len(lengths)/2]

	// The cut pulls, one at a time, each of a fresh image with its own
	// deadline, in rounds: the first spread from a quarter of a pull's
	// length to 1.75 of it; the next ones over the window the rounds so far
	// found between the last pull cut with nothing on the node and the
	// first that completed, where a cut comes after the image arrived.
	type outcome struct {
		image    string
		deadline time.Duration
		code     codes.Code
		arrived  bool // the runtime held the image once the client was gone
	}
	var outcomes []outcome
	cutRound := func(round int, deadlines []time.Duration) {
		var out []outcome
		for i, d := range deadlines {
			img := push(fmt.Sprintf("pull-%d-%02d", round, i))
			ctx, cancel := context.WithTimeout(context.Background(), d)
			err := pull(ctx, img, alicePod)
			cancel()
			out = append(out, outcome{image: img, deadline: d, code: status.Code(err)})
		}
		settled(t, images.names, onNode)
		for i := range out {
			_, out[i].arrived = onNode(out[i].image)
		}
		outcomes = append(outcomes, out...)
	}
	const perRound = 12
	spread := func(lo, hi time.Duration) []time.Duration {
		var ds []time.Duration
		for i := range perRound {
			ds = append(ds, lo+time.Duration(float64(hi-lo)*float64(i)/float64(perRound-1)))
		}
		return ds
	}
	cutAfterArrival := func(o outcome) bool {
		return o.arrived && (o.code == codes.DeadlineExceeded || o.code == codes.Canceled)
	}
	cutRound(1, spread(length/4, length*7/4))
	// A second round, and more until a cut came after an image arrived (at
	// most four in all), each wider than the one before: pulls vary in
	// length on a busy machine.
	for round := 2; round <= 4 && (round == 2 || !slices.ContainsFunc(outcomes, cutAfterArrival)); round++ {
		lo, hi := time.Duration(0), 2*length
		for _, o := range outcomes {
			if !o.arrived {
				lo = max(lo, o.deadline)
			}
			if o.code == codes.OK {
				hi = min(hi, o.deadline)
			}
		}
		lo, hi = min(lo, hi), max(lo, hi)
		half := max((hi-lo)/2, length/8) * time.Duration(round-1)
		mid := (lo + hi) / 2
		cutRound(round, spread(max(mid-half, time.Millisecond), mid+half))
	}
	cut, cutAfter, held := 0, 0, 0
	var summary []string
	for _, o := range outcomes {
		if o.arrived {
			held++
		}
		if o.code == codes.DeadlineExceeded || o.code == codes.Canceled {
			cut++
			if o.arrived {
				cutAfter++
			}
		} else if o.code != codes.OK {
			t.Errorf("%s (deadline %v): %v, want OK or a cut", o.image, o.deadline, o.code)
		}
		summary = append(summary, fmt.Sprintf("%v:%v/%v", o.deadline.Round(time.Millisecond), o.code, map[bool]string{true: "held", false: "absent"}[o.arrived]))
	}
	log := p.proc.LogText()
	t.Logf("%s: one pull %v (measured %v); %d pulls, %d cut by their deadline, %d of them after the image arrived; %d held; "+
		"the proxy found %d image(s) that arrived and kept %d intent(s) of pulls cut before the runtime finished\n%s",
		testRig.Runtime.Name, length, lengths, len(outcomes), cut, cutAfter, held,
		strings.Count(log, "failed, but the image arrived"), strings.Count(log, "a pull was cut before the runtime"), strings.Join(summary, " "))
	if cut == 0 || cut == len(outcomes) {
		t.Errorf("%d of %d pulls were cut: the spread of deadlines missed one pull's length", cut, len(outcomes))
	}
	if cutAfter == 0 {
		t.Errorf("no pull was cut after its image arrived on %s: the case that matters did not happen", testRig.Runtime.Name)
	}
	// Every image of the test the runtime holds, under any of its names.
	all := heldImages(t, testRig.Registry+"/"+repoPrefix)
	if len(all) < held {
		t.Fatalf("the runtime lists %d of the test's images by tag, and answers for %d cut pulls' by name", len(all), held)
	}

	hiddenFromB := func(t *testing.T) { hiddenFromAStranger(t, p, "cut-bob", all) }
	// Until a GC run, the intents of pulls cut before the runtime said it
	// finished protect their images: what a node is in for up to
	// gcInterval.
	t.Run("before a GC run, a tenant without credentials is shown none of them and creates no container of any", hiddenFromB)
	t.Run("a GC run settles every kept intent whose image arrived", func(t *testing.T) {
		if out, err := p.records(t, "gc"); err != nil {
			t.Fatalf("records gc: %v\n%s", err, out)
		}
		left := intentsLeft(t, p)
		for _, in := range left {
			if _, ok := onNode(in.Image); ok {
				t.Errorf("the intent for %s is kept although its image is on the node", in.Image)
			}
		}
		t.Logf("%d intent(s) kept for cut pulls whose image never arrived", len(left))
	})
	t.Run("after it, the same", hiddenFromB)

	t.Run("the puller pulls each again, then its other pod re-uses it with no registry request", func(t *testing.T) {
		alice2 := sandboxConfig(t, "cut-alice2", "cut-alice2-uid")
		verified := 0
		for _, img := range all {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			if len(requestsDuring(t, testRig.Registry, func() {
				if err := kubeletPull(ctx, proxyImages, img.name, alice, alicePod); err != nil {
					t.Errorf("A's pull of %s again: %v", img.name, err)
				}
			})) > 0 {
				verified++
			}
			if n := len(requestsDuring(t, testRig.Registry, func() {
				if err := kubeletPull(ctx, proxyImages, img.name, alice, alice2); err != nil {
					t.Errorf("A's other pod's pull of %s: %v", img.name, err)
				}
			})); n != 0 {
				t.Errorf("A's other pod's pull of %s: %d registry requests, want a re-use", img.name, n)
			}
			cancel()
		}
		t.Logf("%d of %d images verified at the registry again (their pulls were cut), the others re-used", verified, len(all))
	})
}

// settled waits until the runtime, which may finish a pull after its
// client went away, holds the same images for a second; bounded.
func settled(t *testing.T, images []string, onNode func(string) (string, bool)) {
	t.Helper()
	var held []string
	stableSince := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var now []string
		for _, img := range images {
			if _, ok := onNode(img); ok {
				now = append(now, img)
			}
		}
		if !slices.Equal(now, held) {
			held, stableSince = now, time.Now()
		}
		if time.Since(stableSince) > time.Second {
			return
		}
	}
}

// freshImages are private images of a test's own, pushed under a prefix
// (relative to the rig's registry), new on every run (a tag pushed again
// with a new marker is a new image), and removed from the node at the
// test's end.
type freshImages struct {
	t           *testing.T
	prefix, run string
	names       []string // as pushed, with the registry
}

func newFreshImages(t *testing.T, prefix string) *freshImages {
	f := &freshImages{t: t, prefix: prefix, run: fmt.Sprintf("%d", time.Now().UnixNano())}
	t.Cleanup(func() {
		for _, img := range f.names {
			crictl(t, direct(), "rmi", img)
		}
	})
	return f
}

// push pushes prefix+name:v1 and returns its name with the registry.
func (f *freshImages) push(name string) string {
	f.t.Helper()
	ref := f.prefix + name + ":v1"
	if _, err := testRig.PushBusybox(ref, ref+" "+f.run); err != nil {
		f.t.Fatal(err)
	}
	img := testRig.Registry + "/" + ref
	f.names = append(f.names, img)
	return img
}

// kubeletPull is the kubelet's sequence through a CRI client: ImageStatus,
// then PullImage with the pod's credential when the image is not shown.
func kubeletPull(ctx context.Context, c runtimeapi.ImageServiceClient, image string, auth *runtimeapi.AuthConfig, pod *runtimeapi.PodSandboxConfig) error {
	st, err := c.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil || st.GetImage() != nil {
		return err
	}
	_, err = c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth, SandboxConfig: pod})
	return err
}

// heldImage is an image the runtime holds: one of its names, and its ID.
type heldImage struct{ name, id string }

// heldImages is every name the runtime, asked directly, lists an image
// under that starts with prefix, with the image's ID.
func heldImages(t *testing.T, prefix string) []heldImage {
	t.Helper()
	list, err := runtimeapi.NewImageServiceClient(mustDial(t, direct())).ListImages(context.Background(), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []heldImage
	for _, img := range list.Images {
		for _, tag := range img.RepoTags {
			if strings.HasPrefix(tag, prefix) {
				out = append(out, heldImage{tag, img.Id})
			}
		}
	}
	return out
}

// hiddenFromAStranger checks that a pod without credentials (its sandbox
// named name) is shown none of images through the proxy p and is refused
// a container of each, by name and by ID. A failure logs what the proxy
// logged of the image.
func hiddenFromAStranger(t *testing.T, p *ensureProxy, name string, images []heldImage) {
	t.Helper()
	conn := mustDial(t, p.ep)
	proxyImages, proxyRuntime := runtimeapi.NewImageServiceClient(conn), runtimeapi.NewRuntimeServiceClient(conn)
	stranger := sandboxConfig(t, name, name+"-uid")
	ctx := context.Background()
	sb, err := proxyRuntime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: stranger})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		proxyRuntime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId})
		proxyRuntime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
	}()
	for i, img := range images {
		failed := t.Failed()
		st, err := proxyImages.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.name}})
		if err != nil || st.GetImage() != nil {
			t.Errorf("ImageStatus of %s through the proxy: %v, shown %v; want absent", img.name, err, st.GetImage() != nil)
		}
		for j, ref := range []string{img.name, img.id} {
			_, err := proxyRuntime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: stranger,
				Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("%s-%d-%d", name, i, j)}, Image: &runtimeapi.ImageSpec{Image: ref},
					Command: []string{"true"}, LogPath: name + ".log", Linux: &runtimeapi.LinuxContainerConfig{}}})
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("a stranger's container of %s (%s): %v, want PermissionDenied", img.name, ref, err)
			}
		}
		if !failed && t.Failed() {
			t.Logf("the proxy's log of %s:\n%s", img.name, linesWith(p.proc.LogText(), strings.TrimPrefix(img.name, testRig.Registry+"/")))
		}
	}
}

// linesWith is the lines of text that contain s.
func linesWith(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// sandboxConfig is a pod's sandbox configuration for a Go CRI client, as
// podConfig writes it for crictl: host network, its own log directory.
func sandboxConfig(t *testing.T, name, uid string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	logDir := filepath.Join(testRig.Dir, "pod-logs", name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "e2e", Uid: uid, Attempt: 1},
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
}
