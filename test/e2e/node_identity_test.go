package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// The scenarios of the proxy's place on the node: its identity, the
// node's own, and doctor's view of the kubelet's endpoints.

var nodeIdentityScenario = nodeScenario{
	name:   "the proxy's identity is the node's: no secret, account or token of a pod on another node; told from the kubelet in the audit log",
	images: []string{tokenImage, publicImage},
	run:    (*nodeEnv).scenarioNodeIdentity,
}

// scenarioNodeIdentity: the proxy runs with the node's own identity, so
// the Node authorizer and NodeRestriction scope it as they scope the
// kubelet. A pod of B bound to another node has a pull secret and an
// account: the proxy's identity can read neither, nor request a token for
// it, while it can for a pod of its own node; a pull through the proxy in
// that pod's name gets nothing from the API. In the audit log the proxy's
// requests carry its own user agent, apart from the kubelet's, under the
// same user.
func (e *nodeEnv) scenarioNodeIdentity(t *testing.T) {
	ctx := context.Background()
	const otherNode = "other-node"
	image := e.image(tokenImage)
	createPullSecret(t, e.k, e.nsB, "elsewhere-cred", "bob", rig.Users["bob"])
	createServiceAccount(t, e.k, e.nsB, "elsewhere", "bob")
	no := false
	elsewhere, err := e.k.Admin.CoreV1().Pods(e.nsB).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"},
		Spec: corev1.PodSpec{NodeName: otherNode, ServiceAccountName: "elsewhere", AutomountServiceAccountToken: &no,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "elsewhere-cred"}},
			Containers:       []corev1.Container{{Name: "app", Image: image}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Pods of this node: one whose account's token pulls the image (the
	// token plugin), one with A's pull secret.
	here := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "here", image: image, policy: corev1.PullIfNotPresent, account: "builder"}))
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "here-secret", image: e.anonymous(publicImage), policy: corev1.PullIfNotPresent, secret: "regcred"}))

	// The proxy's identity, from its own kubeconfig, with a user agent of
	// its own so that the audit checks below tell these probes apart.
	rc, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.UserAgent = "e2e-identity-probe"
	api, err := podtoken.NewAPI(rc)
	if err != nil {
		t.Fatal(err)
	}
	token := func(ns, sa string, pod *corev1.Pod) error {
		_, err := api.CreateToken(ctx, ns, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{nodeAudience},
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
			ExpirationSeconds: ptrTo(int64(600)),
		}})
		return err
	}
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"the pull secret of its own node's pod", func() error { _, err := api.GetSecret(ctx, e.nsA, "regcred"); return err }},
		{"the account of its own node's pod", func() error { _, err := api.GetServiceAccount(ctx, e.nsA, "builder"); return err }},
		{"a token for its own node's pod", func() error { return token(e.nsA, "builder", here) }},
	} {
		if err := c.call(); err != nil {
			t.Errorf("the node's identity cannot read %s: %v", c.what, err)
		}
	}
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"the pull secret of a pod on another node", func() error { _, err := api.GetSecret(ctx, e.nsB, "elsewhere-cred"); return err }},
		{"the account of a pod on another node", func() error { _, err := api.GetServiceAccount(ctx, e.nsB, "elsewhere"); return err }},
		{"a token for a pod on another node", func() error { return token(e.nsB, "elsewhere", elsewhere) }},
	} {
		if err := c.call(); !apierrors.IsForbidden(err) {
			t.Errorf("the node's identity reading %s: %v, want Forbidden", c.what, c.call())
		}
	}

	// Through the proxy, in the other node's pod's name: the token plugin
	// matches the image, but the proxy's identity cannot even read that pod
	// (the Node authorizer knows no relationship to it). With an identity
	// that could, the proxy would still refuse: podtoken.ErrPodNotOnNode.
	sandbox := writeJSON(t, e.nsB+"-elsewhere-pod.json", map[string]any{
		"metadata": map[string]any{"name": "elsewhere", "namespace": e.nsB, "uid": string(elsewhere.UID), "attempt": 1},
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	})
	if r := crictl(t, e.proxy.ep, "pull", "--pod-config", sandbox, image); r.Err == nil {
		t.Errorf("a pull in the name of a pod on another node succeeded")
	}

	// The audit log: the same user, told apart by user agent.
	var kubelet, proxyTokens, proxyElsewhere, proxyElsewhereGranted, probeRefused int
	deadline := time.Now().Add(30 * time.Second)
	for {
		events, err := e.k.AuditEvents()
		if err != nil {
			t.Fatal(err)
		}
		kubelet, proxyTokens, proxyElsewhere, proxyElsewhereGranted, probeRefused = 0, 0, 0, 0, 0
		for _, ev := range events {
			if ev.User.Username != kuberig.NodeUser {
				continue
			}
			aboutElsewhere := ev.ObjectRef.Namespace == e.nsB && strings.HasPrefix(ev.ObjectRef.Name, "elsewhere")
			switch {
			case strings.HasPrefix(ev.UserAgent, "kubelet/"):
				kubelet++
			case strings.HasPrefix(ev.UserAgent, "cri-image-proxy/") && aboutElsewhere:
				proxyElsewhere++
				if ev.ResponseStatus.Code != 403 {
					proxyElsewhereGranted++
				}
			case strings.HasPrefix(ev.UserAgent, "cri-image-proxy/") && ev.Verb == "create" && ev.ObjectRef.Subresource == "token" && ev.ResponseStatus.Code == 201:
				proxyTokens++
			case ev.UserAgent == rc.UserAgent && aboutElsewhere && ev.ResponseStatus.Code == 403:
				probeRefused++
			}
		}
		if (kubelet > 0 && proxyTokens > 0 && proxyElsewhere > 0 && probeRefused >= 3) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second) // the apiserver writes its audit log in batches
	}
	t.Logf("audit log, user %s: %d requests by the kubelet, %d tokens minted by the proxy, %d proxy requests about the other node's pod (%d granted), %d probes of it refused",
		kuberig.NodeUser, kubelet, proxyTokens, proxyElsewhere, proxyElsewhereGranted, probeRefused)
	if kubelet == 0 || proxyTokens == 0 || proxyElsewhere == 0 || proxyElsewhereGranted != 0 || probeRefused < 3 {
		t.Errorf("want the kubelet's and the proxy's requests apart by user agent, every proxy request about the other node's pod and the 3 probes refused (403)")
	}
}

func ptrTo[T any](v T) *T { return &v }

var doctorScenario = nodeScenario{
	name: "doctor: the kubelet's endpoints are the proxy's socket and it called just now; a proxy on another socket is reported bypassed",
	run:  (*nodeEnv).scenarioDoctor,
}

// scenarioDoctor runs cri-image-proxy doctor against the running kubelet:
// its endpoints (from its KubeletConfiguration) are the proxy's socket and
// the proxy's metrics show it called a moment ago. The same kubelet seen
// from a proxy on another socket is reported as bypassing it.
func (e *nodeEnv) scenarioDoctor(t *testing.T) {
	doctor := func(socket string) (string, error) {
		out, err := exec.Command(proxyBin, "doctor", "--kubelet-pid", strconv.Itoa(e.node.Pid()),
			"--socket", socket, "--monitoring-address", e.mon).CombinedOutput()
		return string(out), err
	}
	out, err := doctor(e.proxy.sock)
	// Four checks of the kubelet's and one of the registry check's configuration.
	if err != nil || strings.Count(out, "ok    ") != 5 || !strings.Contains(out, "containerRuntimeEndpoint), the proxy's socket") || !strings.Contains(out, "registry check: reads") {
		t.Errorf("doctor with the kubelet on the proxy: %v\n%s", err, out)
	}
	t.Logf("doctor:\n%s", out)
	out, err = doctor(filepath.Join(testRig.Dir, "another-proxy.sock"))
	if err == nil || !strings.Contains(out, "the kubelet bypasses the proxy") {
		t.Errorf("doctor with a proxy the kubelet does not call: %v\n%s", err, out)
	}
}
