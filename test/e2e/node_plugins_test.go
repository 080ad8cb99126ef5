package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The scenarios of the proxy's credential plugins (nodePlugins): the
// node-wide one, and the token plugin with service accounts.

var pluginScenario = nodeScenario{
	name:   "proxy plugin credentials (node-wide): Running",
	images: []string{pluginImage},
	run:    (*nodeEnv).scenarioPlugin,
}

func (e *nodeEnv) scenarioPlugin(t *testing.T) {
	image := e.image(pluginImage)
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "plugin-1", image: image, policy: corev1.PullIfNotPresent}, image); n == 0 {
		t.Errorf("the image came without a registry request")
	}
	if e.plugins.runs("node-creds") == 0 {
		t.Errorf("the proxy's plugin never ran")
	}
	if _, n := e.runCounting(t, podSpec{ns: e.nsA, name: "plugin-2", image: image, policy: corev1.PullIfNotPresent}, image); n != 0 {
		t.Errorf("%d registry requests for an image pulled with node-wide credentials, want 0", n)
	}
}

var serviceAccountScenario = nodeScenario{
	name:   "token plugin: SA verified once, another SA verifies",
	images: []string{tokenImage},
	run:    (*nodeEnv).scenarioServiceAccount,
}

// accountPulled is scenario 6's first pod: the token plugin's image,
// pulled with the token of A's service account builder.
func (e *nodeEnv) accountPulled() podSpec {
	return podSpec{ns: e.nsA, name: "sa-1", image: e.image(tokenImage), policy: corev1.PullIfNotPresent, account: "builder"}
}

func (e *nodeEnv) scenarioServiceAccount(t *testing.T) {
	image := e.image(tokenImage)
	a1, n := e.runCounting(t, e.accountPulled(), image)
	if n == 0 {
		t.Errorf("the image came without a registry request")
	}
	if c := e.plugins.claims(t); len(c) == 0 || c[0]["podUID"] != string(a1.UID) || fmt.Sprint(c[0]["audience"]) != "["+nodeAudience+"]" {
		t.Errorf("the token plugin saw %v", c)
	}
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "sa-2", image: image, policy: corev1.PullIfNotPresent, account: "builder"}, image); n == 0 {
		t.Errorf("another service account used the image without verifying")
	}
	if _, n := e.runCounting(t, podSpec{ns: e.nsA, name: "sa-3", image: image, policy: corev1.PullIfNotPresent, account: "builder"}, image); n != 0 {
		t.Errorf("%d registry requests for the same service account, want 0", n)
	}
}

var roleRemovedScenario = nodeScenario{
	name:   "the token plugin's required annotation removed from A's account: its new pod must pull, and cannot",
	images: []string{tokenImage},
	run:    (*nodeEnv).scenarioRoleRemoved,
}

// scenarioRoleRemoved: removing the annotation the token plugin requires
// from a service account is how cloud operators revoke its access (an IAM
// role). The image the account pulled in scenario 6 must not be re-used
// by its new pods: they must pull, and with no role the plugin gives them
// nothing, so they never run.
func (e *nodeEnv) scenarioRoleRemoved(t *testing.T) {
	ctx := context.Background()
	e.ensureRunning(t, e.accountPulled())
	accounts := e.k.Admin.CoreV1().ServiceAccounts(e.nsA)
	sa, err := accounts.Get(ctx, "builder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := sa.Annotations["registry.test/user"]
	delete(sa.Annotations, "registry.test/user")
	if _, err := accounts.Update(ctx, sa, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sa, err := accounts.Get(ctx, "builder", metav1.GetOptions{})
		if err == nil {
			sa.Annotations = map[string]string{"registry.test/user": role}
			_, err = accounts.Update(ctx, sa, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the role: %v", err)
		}
	}()
	p := e.run(t, podSpec{ns: e.nsA, name: "sa-no-role", image: e.image(tokenImage), policy: corev1.PullIfNotPresent, account: "builder"})
	e.waitWaiting(t, p, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, p)
	t.Logf("without its role: %s", e.eventSummary(p))
	zero := int64(0)
	e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	e.waitGone(t, p)
}
