package ensure_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// A pull secret written by kubectl create secret docker-registry (or
// docker login) keys Docker Hub as "https://index.docker.io/v1/". The
// kubelet's keyring serves Docker Hub images from that key, so it links
// the secret to the pull and admits a Never pod of the same secret; the
// proxy must too (keyring.Serving), for every way a pod may name the image.
func TestADockerHubPullSecretEntitlesItsPodsAsTheKubeletDoes(t *testing.T) {
	t.Parallel()
	const refHub = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	for _, image := range []string{
		"docker.io/library/nginx:1.27",
		"nginx:1.27",
		"docker.io/org/app:v1",
		"org/app:v1",
		"index.docker.io/org/app:v1",
	} {
		t.Run(image, func(t *testing.T) {
			t.Parallel()
			s := newAPISetup(t)
			s.node.serve(image, refHub, "hub:h-pw")
			secret := pullSecret("ns", "hubcred", "https://index.docker.io/v1/", "hub:h-pw")
			secret.UID = "hub-secret-uid"
			s.create(t, secret,
				policyPod("ns", "pod-h1", "h1", "", image, corev1.PullIfNotPresent, "hubcred"),
				policyPod("ns", "pod-h2", "h2", "", image, corev1.PullNever, "hubcred"),
				policyPod("ns", "pod-h3", "h3", "", image, corev1.PullNever))
			if got := s.start(pod{uid: "h1", creds: []*runtimeapi.AuthConfig{cred("hub:h-pw")}}, image, "IfNotPresent"); got != running {
				t.Fatalf("the pull with the secret's credential: %s", got)
			}
			repo, _ := imageref.Repository(image)
			rec, err := s.store.Get(refHub)
			if err != nil {
				t.Fatal(err)
			}
			if secs := rec.CredentialMapping[repo].KubernetesSecrets; len(secs) != 1 || secs[0].UID != "hub-secret-uid" {
				t.Errorf("the record does not name the Docker Hub secret the credential came from: %+v", rec.CredentialMapping)
			}
			if got := s.start(pod{uid: "h2"}, image, "Never"); got != running {
				t.Errorf("a Never pod of the same secret: %s, want %s (the kubelet admits it)\n%s", got, running, s.log.String())
			}
			// While h2 waits the image may be shown (pod-aware ImageStatus):
			// h3 is then refused at CreateContainer.
			if got := s.start(pod{uid: "h3"}, image, "Never"); got != errNeverPull && got != deniedCreate {
				t.Errorf("a Never pod without the secret: %s, want it refused", got)
			}
		})
	}
}
