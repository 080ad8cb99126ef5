package e2e

import (
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// How the tests tell a visit to the registry from a re-use on the node:
// the registries' access logs, read around what the test does.

// requestsDuring runs f and returns the requests the registry at addr
// (testRig.AnonRegistry, or else the authenticated one) answered
// meanwhile, 401s included.
func requestsDuring(t *testing.T, addr string, f func()) []rig.RegistryRequest {
	t.Helper()
	before := len(registryLog(t, addr))
	f()
	return registryLog(t, addr)[before:]
}

// verificationsDuring runs f and counts the verifications of image at its
// registry meanwhile: the successful manifest fetches under its
// repository. A pull verified at the registry fetches the manifest (2xx);
// a re-use from the node makes no request; the failed attempts of pods
// without credentials (401s) verify nothing and do not count.
func verificationsDuring(t *testing.T, image string, f func()) int {
	t.Helper()
	addr, repo, _ := strings.Cut(image, "/")
	if i := strings.LastIndexAny(repo, ":@"); i > 0 {
		repo = repo[:i]
	}
	n := 0
	for _, r := range requestsDuring(t, addr, f) {
		if strings.HasPrefix(r.Path, "/v2/"+repo+"/manifests/") && r.Status/100 == 2 {
			n++
		}
	}
	return n
}

// registryRequests is how many requests the authenticated registry has
// answered so far: for a test that waits for one while something runs.
func registryRequests(t *testing.T) int {
	t.Helper()
	return len(registryLog(t, testRig.Registry))
}

// registryLog is every request the registry at addr has answered so far.
func registryLog(t *testing.T, addr string) []rig.RegistryRequest {
	t.Helper()
	reqs, err := testRig.RegistryRequests()
	if addr == testRig.AnonRegistry {
		reqs, err = testRig.AnonRegistryRequests()
	}
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}
