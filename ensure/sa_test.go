package ensure_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
)

// apiSetup is a guard with a (fake) Kubernetes API behind it.
type apiSetup struct {
	*setup
	client *fake.Clientset
	// newGuard makes the guard again, with its API and token plugins, and
	// creds as its credential injection.
	newGuard func(creds ensure.Credentials)
}

func newAPISetup(t *testing.T) *apiSetup {
	t.Helper()
	s := &apiSetup{setup: newSetup(t, decision.NeverVerifyPreloadedImages), client: fake.NewClientset()}
	// Pull secrets and, for ImageStatus, service accounts are read again on
	// every check: a test sees a rotation, a re-creation or a deletion at
	// once (the daemon reuses ImageStatus's reads for a few seconds;
	// TestImageStatusShowsByARecentReadAndCreateContainerDecidesLive has
	// the window).
	src := podtoken.New(podtokentest.API(s.client), "node", podtoken.Options{SecretTTL: time.Nanosecond, AccountTTL: time.Nanosecond})
	ctx, cancel := context.WithCancel(context.Background())
	src.Start(ctx)
	t.Cleanup(func() { cancel(); src.Wait() })
	src.WaitForSync(ctx)
	p, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
	// The token plugins as they are configured now: one for registry.test
	// that runs only for accounts with the role annotation.
	require := true
	plugins, err := credplugins.New(&credplugins.Config{Hash: "h", Providers: []credplugins.Provider{{
		Name: "tp", MatchImages: []string{"registry.test"}, APIVersion: "credentialprovider.kubelet.k8s.io/v1",
		TokenAttributes: &credplugins.TokenAttributes{ServiceAccountTokenAudience: "registry.test", CacheType: "ServiceAccount",
			RequireServiceAccount: &require, RequiredServiceAccountAnnotationKeys: []string{roleAnnotation}},
	}}}, credplugins.Options{Identity: src})
	if err != nil {
		t.Fatal(err)
	}
	s.newGuard = func(creds ensure.Credentials) {
		var err error
		if s.guard, err = ensure.NewGuard(s.store, p, ensure.CRIRuntime(s.node, s.node), ensure.GuardOptions{Clock: s.clock, Pods: src, Accounts: plugins, Registry: s.registryCheck(),
			Credentials: creds, Logger: slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))}); err != nil {
			t.Fatal(err)
		}
	}
	s.newGuard(nil)
	return s
}

// roleAnnotation is the annotation the token plugin requires: removing it
// is how an operator revokes an account's access.
const roleAnnotation = "registry.test/role"

func account(ns, name, uid string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: map[string]string{roleAnnotation: "puller"}}}
}

func (s *apiSetup) create(t *testing.T, objs ...any) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			_, err = s.client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = s.client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = s.client.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// Let the informer see them.
	time.Sleep(100 * time.Millisecond)
}

func apiPod(ns, name, uid, sa, image string, secrets ...string) *corev1.Pod {
	return policyPod(ns, name, uid, sa, image, corev1.PullNever, secrets...)
}

func policyPod(ns, name, uid, sa, image string, policy corev1.PullPolicy, secrets ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: "node", ServiceAccountName: sa, Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: policy}}}}
	for _, s := range secrets {
		p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return p
}

func pullSecret(ns, name, registry, userPass string) *corev1.Secret {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{registry: map[string]string{"auth": b64(userPass)}}})
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: b}}
}

func sandbox(ns, name, uid string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: name, Uid: uid}}
}

func TestPodAwareImageStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newAPISetup(t)
	s.create(t, pullSecret("a", "regcred", "registry.test", "alice:a-pw"), pullSecret("b", "other", "registry.test", "bob:b-pw"))
	// A pulls with its secret's credential: recorded.
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	status := func() bool {
		st, _ := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
		return st.GetImage() != nil
	}
	create := func(ns, name, uid string) error {
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
			SandboxConfig: sandbox(ns, name, uid)}, s.node.CreateContainer)
		return err
	}

	t.Run("a Never pod whose pull secret is verified sees the image and starts", func(t *testing.T) {
		s.create(t, apiPod("a", "never-a", "uid-never-a", "", private, "regcred"))
		if !status() {
			t.Fatalf("the entitled pod's ImageStatus is hidden")
		}
		if err := create("a", "never-a", "uid-never-a"); err != nil {
			t.Errorf("CreateContainer: %v", err)
		}
	})
	t.Run("a Never pod that is not entitled, waiting too, is refused at CreateContainer", func(t *testing.T) {
		s.create(t, apiPod("b", "never-b", "uid-never-b", "", private, "other"))
		if !status() {
			t.Errorf("the entitled pod lost sight of the image")
		}
		if err := create("b", "never-b", "uid-never-b"); err == nil || !strings.Contains(toStatus(err).Error(), "PermissionDenied") {
			t.Errorf("B's container: %v", err)
		}
		if err := create("a", "never-a", "uid-never-a"); err != nil {
			t.Errorf("A's container: %v", err)
		}
	})
	t.Run("another tenant's IfNotPresent pod without a verified credential does not hide it from the entitled Never pod", func(t *testing.T) {
		s.create(t, policyPod("b", "ifnotpresent-b", "uid-inp-b", "", private, corev1.PullIfNotPresent, "other"))
		if !status() {
			t.Errorf("tenant B's waiting IfNotPresent pod hid the image from A's entitled Never pod")
		}
		if err := create("b", "ifnotpresent-b", "uid-inp-b"); err == nil || !strings.Contains(toStatus(err).Error(), "PermissionDenied") {
			t.Errorf("B's IfNotPresent container, shown the image, must still be refused: %v", err)
		}
	})
	t.Run("once no entitled Never pod waits, the image is hidden so that the IfNotPresent pod pulls", func(t *testing.T) {
		for _, name := range []string{"never-a", "never-b"} {
			if err := s.client.CoreV1().Pods(map[string]string{"never-a": "a", "never-b": "b"}[name]).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		s.create(t)
		if status() {
			t.Errorf("the image is shown while an IfNotPresent pod without a verified credential waits for it, and no entitled Never pod does")
		}
	})
}

func TestServiceAccountRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newAPISetup(t)
	s.create(t,
		account("a", "builder", "sa-1"), account("b", "builder", "sa-2"),
		policyPod("a", "p1", "uid-p1", "builder", private, corev1.PullIfNotPresent), policyPod("a", "p2", "uid-p2", "builder", private, corev1.PullIfNotPresent),
		policyPod("b", "q1", "uid-q1", "builder", private, corev1.PullIfNotPresent))
	// Credential injection pulls with a token plugin's credential for the
	// pod's account, and says so.
	s.newGuard(credentialsFunc(func(req *runtimeapi.PullImageRequest) []listedTry {
		m := req.GetSandboxConfig().GetMetadata()
		r := proto.CloneOf(req)
		r.Auth = cred("alice:a-pw")
		return []listedTry{{req: r, used: pullcred.Used{Provider: "tp", ServiceAccount: &pullcred.ServiceAccount{
			Namespace: m.Namespace, Name: "builder", UID: map[string]string{"a": "sa-1", "b": "sa-2"}[m.Namespace]}}}}
	}))
	tokenPull := s.runtimePull
	pull := func(ns, name, uid string) (registryRequests int, err error) {
		before := s.node.registryRequests()
		spec := &runtimeapi.ImageSpec{Image: private}
		if st, _ := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec}, s.nodeImageStatus); st.GetImage() != nil {
			return 0, nil
		}
		_, err = s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec, SandboxConfig: sandbox(ns, name, uid)}, tokenPull)
		return s.node.registryRequests() - before, err
	}

	if n, err := pull("a", "p1", "uid-p1"); n != 1 || err != nil {
		t.Fatalf("first pull: %d requests, %v", n, err)
	}
	rec, _ := s.store.Get(refApp)
	if sas := rec.CredentialMapping["registry.test/team-a/app"].KubernetesServiceAccounts; len(sas) != 1 || sas[0].UID != "sa-1" {
		t.Fatalf("recorded %+v, want the service account a/builder", sas)
	}
	t.Run("the same service account re-uses the image with no registry request", func(t *testing.T) {
		if n, err := pull("a", "p2", "uid-p2"); n != 0 || err != nil {
			t.Errorf("%d registry requests, %v", n, err)
		}
	})
	t.Run("another service account verifies at the registry", func(t *testing.T) {
		if n, err := pull("b", "q1", "uid-q1"); n != 1 || err != nil {
			t.Errorf("%d registry requests, %v", n, err)
		}
	})
	t.Run("an account whose role annotation was removed verifies again, and its pods are no longer entitled", func(t *testing.T) {
		sa := account("b", "builder", "sa-2")
		delete(sa.Annotations, roleAnnotation)
		if _, err := s.client.CoreV1().ServiceAccounts("b").Update(ctx, sa, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.create(t, policyPod("b", "q2", "uid-q2", "builder", private, corev1.PullIfNotPresent), policyPod("b", "q3", "uid-q3", "builder", private, corev1.PullNever))
		if n, _ := pull("b", "q2", "uid-q2"); n != 1 {
			t.Errorf("%d registry requests, want 1: the recorded account was re-used without its role", n)
		}
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
			SandboxConfig: sandbox("b", "q3", "uid-q3")}, s.node.CreateContainer)
		if status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("a pod of the account without its role was let in as entitled: %v", err)
		}
	})
	t.Run("a re-created service account (new UID) verifies again", func(t *testing.T) {
		s.client.CoreV1().ServiceAccounts("a").Delete(ctx, "builder", metav1.DeleteOptions{})
		s.create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "builder", UID: "sa-1-new", Annotations: map[string]string{roleAnnotation: "puller"}}})
		if n, _ := pull("a", "p2", "uid-p2"); n != 1 {
			t.Errorf("%d registry requests, want 1", n)
		}
	})
}

func TestRotatedPullSecretKeepsReuseAndADeletedOneDoesNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newAPISetup(t)
	s.node.serve(private, refApp, "alice:rotated-pw")
	secret := pullSecret("ns", "regcred", "registry.test", "alice:a-pw")
	secret.UID = "secret-uid-1"
	s.create(t, secret, policyPod("ns", "pod-a1", "a1", "", private, corev1.PullIfNotPresent, "regcred"))
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	rec, err := s.store.Get(refApp)
	if err != nil {
		t.Fatal(err)
	}
	if secs := rec.CredentialMapping["registry.test/team-a/app"].KubernetesSecrets; len(secs) != 1 || secs[0].UID != "secret-uid-1" || secs[0].Namespace != "ns" || secs[0].Name != "regcred" {
		t.Fatalf("the record does not name the secret the credential came from: %+v", secs)
	}

	// The namespace's owner rotates the secret: same namespace, name and UID,
	// new password.
	rotated := pullSecret("ns", "regcred", "registry.test", "alice:rotated-pw")
	rotated.UID = "secret-uid-1"
	if _, err := s.client.CoreV1().Secrets("ns").Update(ctx, rotated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	podRotated := pod{uid: "a5", creds: []*runtimeapi.AuthConfig{cred("alice:rotated-pw")}}
	s.create(t, policyPod("ns", "pod-a5", "a5", "", private, corev1.PullIfNotPresent, "regcred"),
		policyPod("ns", "pod-a6", "a6", "", private, corev1.PullNever, "regcred"))
	t.Run("a pod of the rotated secret re-uses the image with no registry request", func(t *testing.T) {
		before := s.node.registryRequests()
		if got := s.start(podRotated, private, "IfNotPresent"); got != running {
			t.Errorf("got %s", got)
		}
		if n := s.node.registryRequests() - before; n != 0 {
			t.Errorf("%d registry requests, want 0", n)
		}
	})
	t.Run("a Never pod of the rotated secret sees the image and starts", func(t *testing.T) {
		if got := s.start(pod{uid: "a6"}, private, "Never"); got != running {
			t.Errorf("got %s", got)
		}
	})
	t.Run("once the secret is deleted, its pods are no longer entitled", func(t *testing.T) {
		if err := s.client.CoreV1().Secrets("ns").Delete(ctx, "regcred", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		s.create(t, policyPod("ns", "pod-a7", "a7", "", private, corev1.PullNever, "regcred"))
		if got := s.start(pod{uid: "a7"}, private, "Never"); got != errNeverPull {
			t.Errorf("got %s, want %s\n%s", got, errNeverPull, s.log.String())
		}
	})
}

// TestAPullSecretEntitlesOnlyWhileItHoldsACredentialForTheRegistry: as the
// kubelet's keyring, which looks a secret's credentials up for the image's
// registry before it matches the secret's coordinates: a secret rotated to
// a new credential for the same registry still entitles its pods; one that
// no longer names the registry entitles nobody, Never pods included.
func TestAPullSecretEntitlesOnlyWhileItHoldsACredentialForTheRegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newAPISetup(t)
	secret := pullSecret("ns", "regcred", "registry.test", "alice:a-pw")
	secret.UID = "secret-uid-1"
	s.create(t, secret, policyPod("ns", "pod-a1", "a1", "", private, corev1.PullIfNotPresent, "regcred"))
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	rotate := func(t *testing.T, registry, userPass string) {
		t.Helper()
		r := pullSecret("ns", "regcred", registry, userPass)
		r.UID = "secret-uid-1"
		if _, err := s.client.CoreV1().Secrets("ns").Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	rotate(t, "other.test", "alice:a-pw")
	s.create(t, policyPod("ns", "pod-a2", "a2", "", private, corev1.PullNever, "regcred"),
		policyPod("ns", "pod-a3", "a3", "", private, corev1.PullIfNotPresent, "regcred"))
	t.Run("a Never pod of a secret that no longer names the registry is not shown the image", func(t *testing.T) {
		if got := s.start(pod{uid: "a2"}, private, "Never"); got != errNeverPull {
			t.Errorf("got %s, want %s", got, errNeverPull)
		}
	})
	t.Run("an IfNotPresent pod of that secret must pull, and has nothing the registry accepts", func(t *testing.T) {
		before := s.node.registryRequests()
		if got := s.start(pod{uid: "a3"}, private, "IfNotPresent"); got != errImagePull {
			t.Errorf("got %s, want %s", got, errImagePull)
		}
		if n := s.node.registryRequests() - before; n != 1 {
			t.Errorf("%d registry requests, want 1", n)
		}
	})

	rotate(t, "registry.test", "alice:rotated-pw")
	s.create(t, policyPod("ns", "pod-a4", "a4", "", private, corev1.PullNever, "regcred"))
	t.Run("rotated to a new credential for the registry, the secret entitles its pods again", func(t *testing.T) {
		if got := s.start(pod{uid: "a4"}, private, "Never"); got != running {
			t.Errorf("got %s, want %s\n%s", got, running, s.log.String())
		}
	})
}

// TestWaitingPodsOfOneAccountAreDecidedOnce: ImageStatus carries no pod, so
// its answer looks at every pod waiting for the image; pods of one
// namespace, service account and pull secrets are entitled alike, and a
// storm of them costs one live read of the account per answer, not one per
// pod (a hundred waiting pods made ImageStatus wait seconds behind the
// API client's rate limit).
func TestWaitingPodsOfOneAccountAreDecidedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newAPISetup(t)
	s.create(t, account("a", "builder", "sa-1"), policyPod("a", "p0", "uid-p0", "builder", private, corev1.PullIfNotPresent))
	s.newGuard(credentialsFunc(func(req *runtimeapi.PullImageRequest) []listedTry {
		r := proto.CloneOf(req)
		r.Auth = cred("alice:a-pw")
		return []listedTry{{req: r, used: pullcred.Used{Provider: "tp", ServiceAccount: &pullcred.ServiceAccount{Namespace: "a", Name: "builder", UID: "sa-1"}}}}
	}))
	if _, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, SandboxConfig: sandbox("a", "p0", "uid-p0")}, s.runtimePull); err != nil {
		t.Fatal(err)
	}
	var waiting []any
	for i := range 20 {
		waiting = append(waiting, policyPod("a", fmt.Sprintf("w%d", i), fmt.Sprintf("uid-w%d", i), "builder", private, corev1.PullNever))
	}
	s.create(t, waiting...)
	accountReads := func() int {
		n := 0
		for _, a := range s.client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "serviceaccounts" {
				n++
			}
		}
		return n
	}
	before := accountReads()
	st, err := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetImage() == nil {
		t.Fatalf("the image is hidden from 20 entitled Never pods")
	}
	if n := accountReads() - before; n != 1 {
		t.Errorf("one answer for 20 waiting pods of one account read the account %d times, want 1", n)
	}
}
