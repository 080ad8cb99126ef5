package ensure_test

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

const (
	private = "registry.test/team-a/app:v1"
	public  = "registry.test/public/tool:v1"
	refApp  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	refTool = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// kubeletResult is how a container start ends, as the kubelet reports it.
type kubeletResult string

const (
	running       kubeletResult = "Running"
	errNeverPull  kubeletResult = "ErrImageNeverPull"
	errImagePull  kubeletResult = "ErrImagePull"
	deniedCreate  kubeletResult = "CreateContainerError(PermissionDenied)"
	unexpectedErr kubeletResult = "unexpected error"
)

// setup is a guard in front of a fake node.
type setup struct {
	node  *fakeNode
	store ensure.RecordStore
	guard *ensure.Guard
	clock *testclock.FakeClock
	// log is what the guard wrote for the operator, debug level included.
	log *syncBuffer
	// checked makes the guard ask the fake node's registry for its word on
	// each pull (GuardOptions.Registry), the verifier innermost, as the
	// daemon chains it.
	checked bool
	// imagePolicy, when set, is the guard's image policy; its gate reads
	// the pods' service accounts from pods, when set.
	imagePolicy cri.Policy
	// pods, when set, is the guard's Kubernetes API.
	pods ensure.NodePods
	// credentials, when set, is the guard's credential injection.
	credentials ensure.Credentials
	// unobserved keeps restart from taking the first look at the node's
	// images that the daemon takes at its start.
	unobserved bool
}

// syncBuffer is a bytes.Buffer safe for the guard's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newSetup(t *testing.T, policy decision.PolicyName, allowlist ...string) *setup {
	t.Helper()
	s := &setup{node: newFakeNode(), store: ensuretest.NewMemoryStore(), clock: testclock.NewFakeClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)), log: &syncBuffer{}}
	s.node.serve(private, refApp, "alice:a-pw", "bob:b-pw")
	s.node.serve(public, refTool, "", "alice:a-pw")
	s.restart(t, policy, allowlist...)
	return s
}

// restart makes a new guard on the same store and node, as a restart of
// the daemon does (in-memory grants and hides are lost).
func (s *setup) restart(t *testing.T, policy decision.PolicyName, allowlist ...string) {
	t.Helper()
	p, err := decision.NewPolicy(policy, allowlist)
	if err != nil {
		t.Fatal(err)
	}
	opts := ensure.GuardOptions{
		Clock:  s.clock,
		Logger: slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	opts.Registry = s.registryCheck()
	if s.imagePolicy != nil {
		pods, _ := s.pods.(cri.Pods)
		opts.ImagePolicy = cri.NewGate(s.imagePolicy, pods, opts.Logger)
	}
	opts.Pods = s.pods
	opts.Credentials = s.credentials
	if s.guard, err = ensure.NewGuard(s.store, p, ensure.CRIRuntime(s.node, s.node), opts); err != nil {
		t.Fatal(err)
	}
	// As the daemon does at its start: the first look at the node's images.
	if !s.unobserved {
		if err := s.guard.ObserveLayers(context.Background()); err != nil {
			t.Fatalf("the first look at the node: %v", err)
		}
	}
}

// start runs the kubelet's CRI sequence for one container: ImageStatus
// unless the pull policy is Always, PullImage with each credential in turn
// (or none) when needed, then CreateContainer with the image ID.
func (s *setup) start(p pod, image, pullPolicy string) kubeletResult {
	return s.startAs(p, image, pullPolicy, false)
}

// startAs is start; byID makes CreateContainer name the image by its ID
// alone, as kubelets before 1.28 do (no user-specified image).
func (s *setup) startAs(p pod, image, pullPolicy string, byID bool) kubeletResult {
	ctx := context.Background()
	spec := &runtimeapi.ImageSpec{Image: image}
	ref := ""
	if pullPolicy != "Always" {
		st, err := s.imageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec})
		if err != nil {
			return unexpectedErr
		}
		ref = st.GetImage().GetId()
		if ref == "" && pullPolicy == "Never" {
			return errNeverPull
		}
	}
	if ref == "" {
		creds := p.creds
		if len(creds) == 0 {
			creds = []*runtimeapi.AuthConfig{nil}
		}
		for _, c := range creds {
			resp, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec, Auth: c, SandboxConfig: p.sandbox()}, s.runtimePull)
			if err == nil {
				ref = resp.ImageRef
				break
			}
		}
		if ref == "" {
			return errImagePull
		}
	}
	userSpecified := image
	if byID {
		userSpecified = ""
	}
	_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  "sandbox-" + p.uid,
		Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: userSpecified}},
		SandboxConfig: p.sandbox(),
	}, s.node.CreateContainer)
	switch {
	case err == nil:
		return running
	case status.Code(toStatus(err)) == codes.PermissionDenied:
		return deniedCreate
	}
	return unexpectedErr
}

// registryCheck is the guard's registry check: the fake node's registry
// when the setup is checked, none otherwise.
func (s *setup) registryCheck() ensure.RegistryCheck {
	if s.checked {
		return s.node
	}
	return nil
}

// runtimePull is the runtime's pull, what the guard's PullImage forwards
// each try to (the guard asks the registry itself when the setup is
// checked).
func (s *setup) runtimePull(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	return s.node.PullImage(ctx, req)
}

// credentialsFunc is credential injection as a test writes it: the tries
// of a request, in order, each with the credential a success records.
type credentialsFunc func(req *runtimeapi.PullImageRequest) []listedTry

func (f credentialsFunc) Tries(req *runtimeapi.PullImageRequest) pullcred.Tries {
	return &listedTries{tries: f(req), err: errors.New("no try was answered")}
}

type listedTry struct {
	req  *runtimeapi.PullImageRequest
	used pullcred.Used
}

// listedTries yields its tries until one is answered with success.
type listedTries struct {
	tries  []listedTry
	answer error
	used   pullcred.Used
	err    error
}

func (l *listedTries) All(ctx context.Context) iter.Seq[*runtimeapi.PullImageRequest] {
	return func(yield func(*runtimeapi.PullImageRequest) bool) {
		for _, t := range l.tries {
			l.answer = errors.New("the try was not answered")
			more := yield(t.req)
			l.used, l.err = pullcred.Used{}, l.answer
			if l.answer == nil {
				l.used = t.used
				return
			}
			if !more || ctx.Err() != nil {
				return
			}
		}
	}
}

func (l *listedTries) Answer(err error)               { l.answer = err }
func (l *listedTries) Result() (pullcred.Used, error) { return l.used, l.err }

// pluginPull is credential injection that pulls with a plugin's credential
// (userPass), as used, after the request's own when it has one.
func pluginPull(userPass string, used pullcred.Used) credentialsFunc {
	return func(req *runtimeapi.PullImageRequest) []listedTry {
		var tries []listedTry
		if req.GetAuth() != nil {
			tries = append(tries, listedTry{req: req})
		}
		r := proto.CloneOf(req)
		r.Auth = cred(userPass)
		return append(tries, listedTry{req: r, used: used})
	}
}

// imageStatus is an ImageStatus through the proxy: the guard's filter
// first, as criproxy applies it, then the guard.
func (s *setup) imageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	if !s.guard.WantsImageStatus(req) {
		return s.node.ImageStatus(ctx, req)
	}
	return s.guard.ImageStatus(ctx, req, s.nodeImageStatus)
}

func (s *setup) nodeImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	return s.node.ImageStatus(ctx, req)
}

// toStatus maps as the proxy's edge does.
var toStatus = criproxy.ToStatus

var (
	podA      = pod{uid: "a1", creds: []*runtimeapi.AuthConfig{cred("alice:a-pw")}}
	podA2     = pod{uid: "a2", creds: []*runtimeapi.AuthConfig{cred("alice:a-pw")}}
	podB      = pod{uid: "b1"}
	podBWrong = pod{uid: "b2", creds: []*runtimeapi.AuthConfig{cred("bob:wrong")}}
	podBOwn   = pod{uid: "b3", creds: []*runtimeapi.AuthConfig{cred("bob:b-pw")}}
	podBTwo   = pod{uid: "b4", creds: []*runtimeapi.AuthConfig{cred("bob:wrong"), cred("alice:a-pw")}}
)

// TestDecisionTable is the proxy's TestShouldPullImage: policy x how the
// image came to the node x the pod's credential x pull policy.
func TestDecisionTable(t *testing.T) {
	t.Parallel()
	type step struct {
		pod        pod
		image      string
		pullPolicy string
		want       kubeletResult
		requests   int // registry requests this step makes
		// byID: the kubelet is older than 1.28: CreateContainer names the
		// image by its ID alone.
		byID bool
		// preload, before the step, puts the private image's digest on the
		// node under this name too, around the proxy (ctr, or a pull of a
		// public copy straight at the runtime).
		preload string
		// restart, before the step, restarts the guard on the same store.
		restart bool
	}
	// The private image's digest under other names: another tag of its
	// repository, and another repository.
	const (
		sameRepo  = "registry.test/team-a/app:node"
		otherRepo = "registry.test/base/app:node"
	)
	for _, tc := range []struct {
		name      string
		policy    decision.PolicyName
		allowlist []string
		preload   bool     // the private image is baked into the node
		preloadAs []string // the private image's digest is baked in under these names
		steps     []step
	}{
		{
			name: "default policy: tenant A pulls with its secret; B without one is hidden the image and fails at the registry",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: private, pullPolicy: "IfNotPresent", want: errImagePull, requests: 1},
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull, requests: 0},
			},
		},
		{
			name: "default policy: a pod with A's credential re-uses the image with no registry request",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podA2, image: private, pullPolicy: "IfNotPresent", want: running, requests: 0},
				{pod: podA2, image: private, pullPolicy: "IfNotPresent", want: running, requests: 0},
			},
		},
		{
			name: "default policy: B with wrong credentials fails; B with its own valid credential verifies once, then re-uses",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podBWrong, image: private, pullPolicy: "IfNotPresent", want: errImagePull, requests: 1},
				{pod: podBOwn, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: pod{uid: "b5", creds: podBOwn.creds}, image: private, pullPolicy: "IfNotPresent", want: running, requests: 0},
			},
		},
		{
			name: "default policy: a pod whose first credential is wrong and second verified pulls once with the second",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podBTwo, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
			},
		},
		{
			name: "default policy: Always means a real pull every time, still verified",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "Always", want: running, requests: 1},
				{pod: podA2, image: private, pullPolicy: "Always", want: running, requests: 1},
				{pod: podB, image: private, pullPolicy: "Always", want: errImagePull, requests: 1},
			},
		},
		{
			name: "default policy: an anonymously pulled public image is never hidden",
			steps: []step{
				{pod: podB, image: public, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podA, image: public, pullPolicy: "IfNotPresent", want: running, requests: 0},
				{pod: pod{uid: "c"}, image: public, pullPolicy: "Never", want: running, requests: 0},
			},
		},
		{
			name:    "default policy: a preloaded image is free to use, even Never",
			preload: true,
			steps: []step{
				{pod: podB, image: private, pullPolicy: "Never", want: running, requests: 0},
				{pod: podB, image: private, pullPolicy: "IfNotPresent", want: running, requests: 0},
			},
		},
		{
			name:   "NeverVerify: anyone uses a present image",
			policy: decision.NeverVerify,
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: private, pullPolicy: "Never", want: running, requests: 0},
			},
		},
		{
			name:    "AlwaysVerify: even a preloaded image needs a verified credential",
			policy:  decision.AlwaysVerify,
			preload: true,
			steps: []step{
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull, requests: 0},
				{pod: podB, image: private, pullPolicy: "IfNotPresent", want: errImagePull, requests: 1},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podA2, image: private, pullPolicy: "IfNotPresent", want: running, requests: 0},
			},
		},
		{
			name:      "default policy: preloaded as another tag of its repository, then pulled by A with its secret: the preloaded tag stays free to all, by name and by ID, across a restart; A's tag stays A's",
			preloadAs: []string{sameRepo},
			steps: []step{
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: running},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: running, byID: true},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: running},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: running, byID: true},
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull},
				{pod: podB, image: private, pullPolicy: "IfNotPresent", want: errImagePull, requests: 1},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: running, restart: true},
				{pod: podB, image: sameRepo, pullPolicy: "IfNotPresent", want: running, byID: true},
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull},
				{pod: podA2, image: private, pullPolicy: "IfNotPresent", want: running},
			},
		},
		{
			name:      "default policy: preloaded under another repository, then pulled by A with its secret: free by its name (as before) and now by ID, across a restart; A's name stays A's",
			preloadAs: []string{otherRepo},
			steps: []step{
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running, byID: true},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running, byID: true},
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running, byID: true, restart: true},
				{pod: podB, image: private, pullPolicy: "IfNotPresent", want: errImagePull, requests: 1},
			},
		},
		{
			name:      "default policy: a preloaded tag A pulls again with its secret stays preloaded",
			preloadAs: []string{private},
			steps: []step{
				{pod: podA, image: private, pullPolicy: "Always", want: running, requests: 1},
				{pod: podB, image: private, pullPolicy: "Never", want: running},
				{pod: podB, image: private, pullPolicy: "Never", want: running, byID: true},
			},
		},
		{
			name: "default policy: A's pull first, then the same digest appears under another tag of its repository: that tag is A's repository's, by name and by ID",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull, preload: sameRepo},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull, byID: true},
				{pod: podA2, image: sameRepo, pullPolicy: "IfNotPresent", want: running},
			},
		},
		{
			name: "default policy: A's pull first, then the same digest appears under another repository: free by that name, as before (per repository); by ID still A's",
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running, preload: otherRepo},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: deniedCreate, byID: true},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running, restart: true},
			},
		},
		{
			name:      "AlwaysVerify: preloaded names change nothing: verified before and after A's pull",
			policy:    decision.AlwaysVerify,
			preloadAs: []string{sameRepo, otherRepo},
			steps: []step{
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: errNeverPull},
			},
		},
		{
			name:      "NeverVerifyAllowlistedImages: preloaded names change nothing: the allowlist alone decides, before and after A's pull",
			policy:    decision.NeverVerifyAllowlistedImages,
			allowlist: []string{"registry.test/base/*"},
			preloadAs: []string{sameRepo, otherRepo},
			steps: []step{
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: sameRepo, pullPolicy: "Never", want: errNeverPull},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: running},
				{pod: podB, image: otherRepo, pullPolicy: "Never", want: deniedCreate, byID: true},
			},
		},
		{
			name:      "NeverVerify: preloaded names change nothing: any pod uses any present image",
			policy:    decision.NeverVerify,
			preloadAs: []string{sameRepo},
			steps: []step{
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
				{pod: podB, image: private, pullPolicy: "Never", want: running, byID: true},
			},
		},
		{
			name:      "NeverVerifyAllowlistedImages: an allowlisted image is free, another preloaded one is not",
			policy:    decision.NeverVerifyAllowlistedImages,
			allowlist: []string{"registry.test/public/*"},
			preload:   true,
			steps: []step{
				{pod: podB, image: private, pullPolicy: "Never", want: errNeverPull, requests: 0},
				{pod: podB, image: public, pullPolicy: "IfNotPresent", want: running, requests: 0},
				{pod: pod{uid: "c"}, image: public, pullPolicy: "Never", want: running, requests: 0},
				{pod: podA, image: private, pullPolicy: "IfNotPresent", want: running, requests: 1},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			policy := tc.policy
			if policy == "" {
				policy = decision.NeverVerifyPreloadedImages
			}
			s := newSetup(t, policy, tc.allowlist...)
			if tc.preload {
				s.node.preload(private, refApp)
				s.node.preload(public, refTool)
			}
			for _, name := range tc.preloadAs {
				s.node.preload(name, refApp)
			}
			for i, st := range tc.steps {
				if st.preload != "" {
					s.node.preload(st.preload, refApp)
				}
				if st.restart {
					s.restart(t, policy, tc.allowlist...)
				}
				before := s.node.registryRequests()
				got := s.startAs(st.pod, st.image, st.pullPolicy, st.byID)
				if got != st.want {
					t.Errorf("step %d (pod %s, %s, %s, by ID %v): %s, want %s", i, st.pod.uid, st.image, st.pullPolicy, st.byID, got, st.want)
				}
				if n := s.node.registryRequests() - before; n != st.requests {
					t.Errorf("step %d (pod %s): %d registry requests, want %d", i, st.pod.uid, n, st.requests)
				}
			}
		})
	}
}

func TestCreateContainer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	create := func(s *setup, p pod, image, userImage string) error {
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: image, UserSpecifiedImage: userImage}},
			SandboxConfig: p.sandbox(),
		}, s.node.CreateContainer)
		return err
	}

	t.Run("a container started by another route is refused, naming image and pod", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		err := create(s, podB, refApp, private)
		if status.Code(toStatus(err)) != codes.PermissionDenied || !strings.Contains(err.Error(), private) || !strings.Contains(err.Error(), "uid b1") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("the refused pod is told only the image it named; the image ID and the rule go to the operator's log", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		err := create(s, podB, refApp, private)
		if status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Fatalf("got %v", err)
		}
		for _, secret := range []string{refApp, refApp[7:19], "with credentials\n", "rule", "team-a/app was pulled"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the tenant's error says %q: %v", secret, err)
			}
		}
		if !strings.Contains(err.Error(), "it runs only after a pull for this pod that the registry accepts") {
			t.Errorf("the error does not say what to do: %v", err)
		}
		if log := s.log.String(); !strings.Contains(log, "container refused") || !strings.Contains(log, refApp) || !strings.Contains(log, "was pulled with credentials") {
			t.Errorf("the operator's log lacks the image ID or the rule:\n%s", log)
		}
	})
	t.Run("an image given by ID only is refused when some repository of it is restricted", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		if err := create(s, podB, refApp, ""); status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("got %v", err)
		}
		if err := create(s, podB, refApp[7:19], refApp[7:19]); status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("an ID prefix as the image: got %v", err)
		}
	})
	t.Run("the pod that pulled the image may create its container", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		if err := create(s, podA, refApp, private); err != nil {
			t.Errorf("got %v", err)
		}
	})
	t.Run("removing the pod's sandbox drops its grants", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.sandboxes["sandbox-a1"] = "a1"
		s.start(podA, private, "IfNotPresent")
		if _, err := s.guard.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: "sandbox-a1"}, s.node.RemovePodSandbox); err != nil {
			t.Fatal(err)
		}
		if err := create(s, podA, refApp, private); status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("a removed pod's grant still let a container in: %v", err)
		}
	})
	t.Run("when the store fails, verification is required", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.preload(private, refApp) // preloaded: normally free
		s.store.(*ensuretest.MemoryStore).Fail = errors.New("disk on fire")
		if err := create(s, podB, refApp, private); status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("got %v", err)
		}
		st, _ := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
		if st.GetImage() != nil {
			t.Errorf("ImageStatus showed the image while the store fails")
		}
	})
}

func TestImageStatusByIDIsAnsweredAsTheRuntimeAnswers(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.start(podA, private, "IfNotPresent")
	ctx := context.Background()
	for _, img := range []string{refApp, refApp[7:]} {
		st, err := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}}, s.nodeImageStatus)
		if err != nil || st.GetImage().GetId() != refApp {
			t.Errorf("ImageStatus(%s) = %v, %v; want the image", img, st, err)
		}
	}
	st, _ := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
	if st.GetImage() != nil {
		t.Errorf("by name the image is not hidden")
	}
}

func TestRecordsAndIntents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a failed pull leaves no intent and no record", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podBWrong, private, "IfNotPresent")
		if r, i, _ := s.store.Counts(); r != 0 || i != 0 {
			t.Errorf("%d records, %d intents", r, i)
		}
	})
	t.Run("an intent left by a crash makes the image need verification by everyone", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		// The crash: the runtime finished the pull, the record was not written.
		s.store.AddIntent(private)
		s.node.preload(private, refApp)
		s.unobserved = true // Recover settles it here, not the first look (which would too)
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("before the intents are settled a Never pod got %s", got)
		}
		if n, d, err := s.guard.Recover(ctx); n != 1 || d != 0 || err != nil {
			t.Fatalf("Recover = %d, %d, %v", n, d, err)
		}
		if got := s.start(podA, private, "Never"); got != errNeverPull {
			t.Errorf("after a crash mid-pull a Never pod got %s", got)
		}
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Errorf("with a verified credential: %s", got)
		}
		if _, i, _ := s.store.Counts(); i != 0 {
			t.Errorf("%d intents left", i)
		}
	})
	t.Run("an intent of repo:tag@digest matches the image containerd lists as repo@digest", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		dgst := "sha256:" + strings.Repeat("3", 64)
		s.store.AddIntent("registry.test/team-a/app:v1@" + dgst)
		s.node.preload("registry.test/team-a/app@"+dgst, refApp)
		s.unobserved = true // Recover settles it here, not the first look (which would too)
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if n, d, err := s.guard.Recover(ctx); n != 1 || d != 0 || err != nil {
			t.Fatalf("Recover = %d converted, %d dropped, %v; want the intent converted", n, d, err)
		}
		if got := s.start(podB, "registry.test/team-a/app@"+dgst, "Never"); got != errNeverPull {
			t.Errorf("after the crash a Never pod without credentials got %s", got)
		}
	})
	t.Run("an intent whose image is not listed is kept: the image, appearing later, needs verification", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.store.AddIntent(private)
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if n, k, err := s.guard.Recover(ctx); n != 0 || k != 1 || err != nil {
			t.Fatalf("Recover = %d converted, %d kept, %v", n, k, err)
		}
		// The runtime lists it only now (it was slow, or the pull finished
		// after the proxy's restart).
		s.node.preload(private, refApp)
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("a Never pod without credentials got %s: the kept intent's image was taken for a preloaded one", got)
		}
		if _, _, err := s.guard.GC(ctx); err != nil {
			t.Fatal(err)
		}
		if r, i, _ := s.store.Counts(); r != 1 || i != 0 {
			t.Errorf("after GC found the image: %d records, %d intents; want the intent turned into a record", r, i)
		}
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("after GC settled it, a Never pod without credentials got %s", got)
		}
	})
	t.Run("a kept intent is settled by a pull of its image through the proxy", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.store.AddIntent(private)
		s.restart(t, decision.NeverVerifyPreloadedImages)
		s.guard.Recover(ctx)
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		if r, i, _ := s.store.Counts(); r != 1 || i != 0 {
			t.Errorf("%d records, %d intents; want A's record and no intent", r, i)
		}
	})
	t.Run("before a first settle, a failed pull of a crashed pull's image does not drop its intent", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		// The crash: the runtime finished A's pull, the record was not
		// written; the runtime did not answer at the restart, so no settle.
		s.store.AddIntent(private)
		s.node.preload(private, refApp)
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podBWrong, private, "Always"); got != errImagePull {
			t.Fatalf("B with a wrong password: %s", got)
		}
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("after B's failed pull a Never pod without credentials got %s: the unsettled intent was dropped", got)
		}
	})
	t.Run("an intent whose name is no reference protects nothing and is dropped", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.store.AddIntent("Not A Reference")
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if n, k, err := s.guard.Recover(ctx); n != 0 || k != 0 || err != nil {
			t.Errorf("Recover = %d converted, %d kept, %v", n, k, err)
		}
	})
	t.Run("records survive a restart; grants do not, which costs a pull from the node, not the registry", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		s.restart(t, decision.NeverVerifyPreloadedImages)
		before := s.node.registryRequests()
		if got := s.start(podA2, private, "IfNotPresent"); got != running {
			t.Errorf("after a restart: %s", got)
		}
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("after a restart B got %s", got)
		}
		if n := s.node.registryRequests() - before; n != 0 {
			t.Errorf("%d registry requests", n)
		}
	})
	t.Run("RemoveImage drops the record", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		if _, err := s.guard.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.node.RemoveImage); err != nil {
			t.Fatal(err)
		}
		if _, err := s.store.Get(refApp); !errors.Is(err, ensure.ErrNotFound) {
			t.Errorf("record still there: %v", err)
		}
	})
	t.Run("GC drops records of images gone, after the grace period", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		s.node.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: private}}) // behind the proxy's back
		if r, _, _ := s.guard.GC(ctx); r != 0 {
			t.Errorf("GC dropped a record within the grace period")
		}
		s.clock.Step(11 * time.Minute)
		if r, _, _ := s.guard.GC(ctx); r != 1 {
			t.Errorf("GC dropped %d records, want 1", r)
		}
	})
}

func TestEveryPolicyIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range decision.Policies {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/configuration.md does not name policy %s", name)
		}
		if !strings.Contains(decision.PolicyHelp(), name+": ") {
			t.Errorf("the flag help does not say what %s does", name)
		}
	}
}

func TestPolicyValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		policy    decision.PolicyName
		allowlist []string
		want      string
	}{
		{"an unknown policy is refused", "Sometimes", nil, "Unsupported value"},
		{"an allowlist without its policy is refused", decision.AlwaysVerify, []string{"registry.test/app"}, "only with policy NeverVerifyAllowlistedImages"},
		{"an empty pattern is refused", decision.NeverVerifyAllowlistedImages, []string{""}, "empty"},
		{"spaces are refused", decision.NeverVerifyAllowlistedImages, []string{" registry.test/app"}, "spaces"},
		{"a wildcard other than a trailing /* is refused", decision.NeverVerifyAllowlistedImages, []string{"registry.test/*/app"}, "only a trailing /*"},
		{"a lone /* is refused", decision.NeverVerifyAllowlistedImages, []string{"/*"}, "registry hostname is required"},
		{"a tag is refused", decision.NeverVerifyAllowlistedImages, []string{"registry.test/app:v1"}, "normalized repository"},
		{"a short name is refused", decision.NeverVerifyAllowlistedImages, []string{"nginx"}, "docker.io/library/nginx"},
		{"valid patterns pass", decision.NeverVerifyAllowlistedImages, []string{"docker.io/library/nginx", "registry.test/team/*"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decision.NewPolicy(tc.policy, tc.allowlist)
			if tc.want == "" {
				if err != nil {
					t.Errorf("got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTheFilterNeverSkipsAHide checks that ImageStatus calls the guard
// lets pass undecoded are exactly ones it would not have hidden.
func TestTheFilterNeverSkipsAHide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Every policy of the table, a new one included, must pass.
	for _, name := range decision.Policies {
		policy := decision.PolicyName(name)
		for _, preload := range []bool{false, true} {
			var allow []string
			if policy == decision.NeverVerifyAllowlistedImages {
				allow = []string{"registry.test/public/*"}
			}
			s := newSetup(t, policy, allow...)
			if preload {
				s.node.preload(private, refApp)
				s.node.preload(public, refTool)
			}
			check := func(when string) {
				for _, img := range []string{private, public, refApp, "registry.test/team-a/app", "registry.test/absent:v1"} {
					req := &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}}
					shownByRuntime, _ := s.node.ImageStatus(ctx, req)
					st, err := s.guard.ImageStatus(ctx, req, s.nodeImageStatus)
					hidden := err == nil && shownByRuntime.GetImage() != nil && st.GetImage() == nil
					if hidden && !s.guard.WantsImageStatus(req) {
						t.Errorf("%s, preload %v, %s: %s would be hidden but the filter lets it pass", policy, preload, when, img)
					}
				}
			}
			check("at first")
			s.start(podA, private, "IfNotPresent")
			check("after A's pull")
			s.start(podB, public, "IfNotPresent")
			check("after B's public pull")
		}
	}
}
