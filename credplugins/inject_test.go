package credplugins

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	testclock "k8s.io/utils/clock/testing"
)

// registry is a fake runtime behind the hook: it accepts the credentials in
// valid and answers 401 as containerd does otherwise.
type registry struct {
	valid map[string]bool // "user:password"; ":" is anonymous
	seen  []*runtimeapi.PullImageRequest
}

func (r *registry) next(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	r.seen = append(r.seen, proto.CloneOf(req))
	a := req.GetAuth()
	if r.valid[a.GetUsername()+":"+a.GetPassword()] {
		return &runtimeapi.PullImageResponse{ImageRef: "sha256:abc"}, nil
	}
	return nil, status.Error(codes.Unknown, `failed to pull and unpack image "x": pulling from host registry.test failed with status code [manifests v1]: 401 Unauthorized`)
}

func TestPullTriesEachCredentialAndSaysWhichSucceeded(t *testing.T) {
	t.Parallel()
	answer := func(auth map[string]credentialproviderapi.AuthConfig) *fakeRunner {
		return &fakeRunner{keyType: "Registry", auth: auth}
	}
	for _, tc := range []struct {
		name        string
		runner      *fakeRunner
		req         *runtimeapi.PullImageRequest
		valid       map[string]bool
		wantTries   []string // user:password the runtime saw, in order
		wantUsed    string   // the provider Pull says succeeded ("" the request's own, or anonymous)
		wantCode    codes.Code
		wantInError []string
	}{
		{
			name:      "a pull without auth gets the provider's credential, username and password only",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "good"}}),
			req:       pull("registry.test/team/app:v1", nil),
			valid:     map[string]bool{"u:good": true},
			wantTries: []string{"u:good"},
			wantUsed:  "p",
		},
		{
			name:      "a request with its own auth is forwarded untouched, the plugin not run",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "good"}}),
			req:       pull("registry.test/team/app:v1", &runtimeapi.AuthConfig{Username: "kubelet", Password: "secret", ServerAddress: "registry.test"}),
			valid:     map[string]bool{"kubelet:secret": true},
			wantTries: []string{"kubelet:secret"},
		},
		{
			name:      "a request whose own auth the registry refuses falls back to the provider's credential, as the kubelet's keyring does",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "good"}}),
			req:       pull("registry.test/team/app:v1", &runtimeapi.AuthConfig{Username: "kubelet", Password: "wrong-s3cret"}),
			valid:     map[string]bool{"u:good": true},
			wantTries: []string{"kubelet:wrong-s3cret", "u:good"},
			wantUsed:  "p",
		},
		{
			name:        "a refused request auth with no provider for the image gets the runtime's own error, no anonymous try",
			runner:      answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "good"}}),
			req:         pull("public.test/app:v1", &runtimeapi.AuthConfig{Username: "kubelet", Password: "wrong-s3cret"}),
			valid:       map[string]bool{":": true},
			wantTries:   []string{"kubelet:wrong-s3cret"},
			wantCode:    codes.Unknown,
			wantInError: []string{"401 Unauthorized"},
		},
		{
			name:        "when the request's auth and every candidate fail, the error lists them all",
			runner:      answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "stale-s3cret"}}),
			req:         pull("registry.test/team/app:v1", &runtimeapi.AuthConfig{Username: "kubelet", Password: "wrong-s3cret"}),
			valid:       map[string]bool{},
			wantTries:   []string{"kubelet:wrong-s3cret", "u:stale-s3cret"},
			wantCode:    codes.Unknown,
			wantInError: []string{"[0] the request's own credential: failed to pull", `[1] plugin p, key "registry.test"`},
		},
		{
			name:      "an image no provider matches is pulled anonymously",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "good"}}),
			req:       pull("public.test/app:v1", nil),
			valid:     map[string]bool{":": true},
			wantTries: []string{":"},
		},
		{
			name:      "candidates are tried in order until one succeeds",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"registry.test/team": {Username: "team", Password: "stale"}, "registry.test": {Username: "u", Password: "good"}}),
			req:       pull("registry.test/team/app:v1", nil),
			valid:     map[string]bool{"u:good": true},
			wantTries: []string{"team:stale", "u:good"},
			wantUsed:  "p",
		},
		{
			name:        "when every candidate fails, the error lists the tries and keeps the runtime's code",
			runner:      answer(map[string]credentialproviderapi.AuthConfig{"registry.test/team": {Username: "team", Password: "stale-s3cret"}, "registry.test": {Username: "u", Password: "wrong-s3cret"}}),
			req:         pull("registry.test/team/app:v1", nil),
			valid:       map[string]bool{},
			wantTries:   []string{"team:stale-s3cret", "u:wrong-s3cret"},
			wantCode:    codes.Unknown,
			wantInError: []string{"registry.test/team/app:v1", `[1] plugin p, key "registry.test/team": failed to pull`, `[2] plugin p, key "registry.test"`, "401 Unauthorized"},
		},
		{
			name:        "a failing plugin is named when the anonymous pull fails",
			runner:      &fakeRunner{err: ErrPluginTimeout},
			req:         pull("registry.test/team/app:v1", nil),
			valid:       map[string]bool{},
			wantTries:   []string{":"},
			wantCode:    codes.Unknown,
			wantInError: []string{"no credential to try", "plugin p gave no credentials", "timed out"},
		},
		{
			name:      "an empty credential is an anonymous try, with no auth at all",
			runner:    answer(map[string]credentialproviderapi.AuthConfig{"*.test": {}}),
			req:       pull("registry.test/app", nil),
			valid:     map[string]bool{":": true},
			wantTries: []string{":"},
			wantUsed:  "p",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := newTestInjector(t, testclock.NewFakeClock(t0), prov("p", time.Hour, tc.runner, "registry.test", "*.test"))
			reg := &registry{valid: tc.valid}
			orig := proto.CloneOf(tc.req)
			resp, used, err := in.Pull(context.Background(), tc.req, reg.next)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("got %v, want code %v", err, tc.wantCode)
			}
			if used.Provider != tc.wantUsed {
				t.Errorf("Pull says provider %q succeeded, want %q", used.Provider, tc.wantUsed)
			}
			if err == nil && resp.ImageRef != "sha256:abc" {
				t.Errorf("ref %q", resp.ImageRef)
			}
			var tries []string
			for i, r := range reg.seen {
				tries = append(tries, r.GetAuth().GetUsername()+":"+r.GetAuth().GetPassword())
				injected := !hasAuth(orig.Auth) || i > 0
				if a := r.GetAuth(); a != nil && injected && (a.ServerAddress != "" || a.Auth != "" || a.IdentityToken != "") {
					t.Errorf("injected auth carries more than username and password: %v", a)
				}
				if !proto.Equal(r.Image, orig.Image) || !proto.Equal(r.SandboxConfig, orig.SandboxConfig) {
					t.Errorf("the hook changed the request beyond auth")
				}
			}
			if diff := cmp.Diff(tc.wantTries, tries); diff != "" {
				t.Errorf("tries (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(orig, tc.req, protocmp.Transform()); diff != "" {
				t.Errorf("the caller's request was modified:\n%s", diff)
			}
			if hasAuth(orig.Auth) && err == nil && len(tries) == 1 && tc.runner.runs.Load() != 0 {
				t.Errorf("the plugin ran for a request whose own auth succeeded")
			}
			for _, w := range tc.wantInError {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error holds a password: %v", err)
			}
		})
	}
}

func pull(image string, auth *runtimeapi.AuthConfig) *runtimeapi.PullImageRequest {
	return &runtimeapi.PullImageRequest{
		Image:         &runtimeapi.ImageSpec{Image: image},
		Auth:          auth,
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod", Namespace: "ns", Uid: "uid"}},
	}
}

func TestPullStopsWhenTheCallerGivesUp(t *testing.T) {
	t.Parallel()
	in := newTestInjector(t, testclock.NewFakeClock(t0), prov("p", time.Hour,
		&fakeRunner{keyType: "Registry", auth: map[string]credentialproviderapi.AuthConfig{"registry.test/a": {Username: "a"}, "registry.test": {Username: "b"}}}, "registry.test"))
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	_, err := in.PullImage(ctx, pull("registry.test/a/app", nil), func(ctx context.Context, _ *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		tries++
		cancel()
		return nil, status.Error(codes.Canceled, "context canceled")
	})
	if status.Code(err) != codes.Canceled || tries != 1 {
		t.Errorf("got %v after %d tries, want Canceled after 1", err, tries)
	}
}

func TestTriesWithoutAnAnswerFailThePull(t *testing.T) {
	t.Parallel()
	in := newTestInjector(t, testclock.NewFakeClock(t0), prov("p", time.Hour,
		&fakeRunner{keyType: "Registry", auth: map[string]credentialproviderapi.AuthConfig{"registry.test/a": {Username: "a"}, "registry.test": {Username: "b"}}}, "registry.test"))
	for _, tc := range []struct {
		name string
		loop func(tries pullcred.Tries) int
	}{
		{"tries never run are no success", func(pullcred.Tries) int { return 0 }},
		{"a try left unanswered is no success, and no further try follows", func(tries pullcred.Tries) int {
			n := 0
			for range tries.All(context.Background()) {
				n++
			}
			return n
		}},
		{"a loop that breaks off after a failure gets no further try", func(tries pullcred.Tries) int {
			n := 0
			for range tries.All(context.Background()) {
				n++
				tries.Answer(status.Error(codes.Unknown, "401 Unauthorized"))
				break
			}
			return n
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries := in.Tries(pull("registry.test/a/app", nil))
			if n := tc.loop(tries); n > 1 {
				t.Errorf("%d tries were yielded, want at most 1", n)
			}
			if _, err := tries.Result(); err == nil {
				t.Error("the pull succeeded")
			}
		})
	}
}
