package e2e

import "testing"

func TestCrictlVersionThroughTheProxy(t *testing.T) {
	needRig(t)
	d := mustCrictl(t, direct(), "version")
	p := mustCrictl(t, proxied(), "version")
	if d != p {
		t.Errorf("crictl version differs:\ndirect:\n%s\nproxied:\n%s", d, p)
	}
	t.Logf("crictl version through the proxy:\n%s", p)
}
