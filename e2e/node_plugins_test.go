package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func (e *nodeEnv) scenarioPlugin(t *testing.T) {
	before := pulls(t, e.byPlugin)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "plugin-1", image: e.byPlugin, policy: corev1.PullIfNotPresent}))
	if pulls(t, e.byPlugin) == before {
		t.Errorf("the image came without a registry request")
	}
	if e.plugins.runs("node-creds") == 0 {
		t.Errorf("the proxy's plugin never ran")
	}
	before = pulls(t, e.byPlugin)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "plugin-2", image: e.byPlugin, policy: corev1.PullIfNotPresent}))
	if n := pulls(t, e.byPlugin) - before; n != 0 {
		t.Errorf("%d registry requests for an image pulled with node-wide credentials, want 0", n)
	}
}

func (e *nodeEnv) scenarioServiceAccount(t *testing.T) {
	before := pulls(t, e.bySA)
	a1 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "sa-1", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if pulls(t, e.bySA) == before {
		t.Errorf("the image came without a registry request")
	}
	if c := e.plugins.claims(t); len(c) == 0 || c[0]["podUID"] != string(a1.UID) || fmt.Sprint(c[0]["audience"]) != "["+nodeAudience+"]" {
		t.Errorf("the token plugin saw %v", c)
	}
	before = pulls(t, e.bySA)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "sa-2", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if pulls(t, e.bySA) == before {
		t.Errorf("another service account used the image without verifying")
	}
	before = pulls(t, e.bySA)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "sa-3", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if n := pulls(t, e.bySA) - before; n != 0 {
		t.Errorf("%d registry requests for the same service account, want 0", n)
	}
}

// scenarioRoleRemoved: removing the annotation the token plugin requires
// from a service account is how cloud operators revoke its access (an IAM
// role). The image the account pulled in scenario 6 must not be re-used
// by its new pods: they must pull, and with no role the plugin gives them
// nothing, so they never run.
func (e *nodeEnv) scenarioRoleRemoved(t *testing.T) {
	ctx := context.Background()
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
	p := e.run(t, podSpec{ns: e.nsA, name: "sa-no-role", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"})
	e.waitWaiting(t, p, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, p)
	t.Logf("without its role: %s", e.eventSummary(p))
	zero := int64(0)
	e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	e.waitGone(t, p)
}
