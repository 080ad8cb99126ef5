package e2e

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig/kuberig"
)

// The node tests run the product under a real kubelet: one-node cluster on
// this machine (etcd, kube-apiserver with Node,RBAC and NodeRestriction, a
// kubelet whose runtime endpoint is the proxy, containerd, the
// password-protected registry), real pods bound by spec.nodeName, on the
// current kubelet with its own KEP-2535 feature off and on, and on one from
// before KEP-2535 and KEP-4412, the proxy's main customer.
//
// The proxy runs with the node's credentials (system:node:127.0.0.1), so
// the Node authorizer, NodeRestriction and the token audience restriction
// (deploy/kubernetes/token-audiences.yaml) apply to it as they would on a
// node.

// kubeletVariant is a kubelet the scenarios run on.
type kubeletVariant struct {
	name    string // a column of the result table
	id      string // a prefix for its namespaces and images
	version string
	gates   map[string]bool
}

var kubeletVariants = []kubeletVariant{
	{name: kuberig.KubeVersion + " (its ensure off)", id: "cur-off", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": false}},
	{name: kuberig.KubeVersion + " (its ensure on)", id: "cur-on", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": true}},
	{name: kuberig.OldKubeVersion + " (no KEP-2535/4412)", id: "old", version: kuberig.OldKubeVersion},
}

// nodeAudience is the token plugin's audience in the node tests; the node
// may request it through token-audiences.yaml.
const nodeAudience = "registry.node.test"

// nodeResults is the scenario x kubelet table the node tests print.
type nodeResults struct {
	runtime   string
	mu        sync.Mutex
	scenarios []string
	result    map[[2]string]string
}

func (r *nodeResults) set(scenario, variant, result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.scenarios, scenario) {
		r.scenarios = append(r.scenarios, scenario)
	}
	r.result[[2]string{scenario, variant}] = result
}

func (r *nodeResults) markdown() string {
	var b strings.Builder
	b.WriteString("| runtime | scenario |")
	for _, v := range kubeletVariants {
		b.WriteString(" kubelet " + v.name + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(kubeletVariants)) + "\n")
	sort.SliceStable(r.scenarios, func(i, j int) bool { return scenarioNumber(r.scenarios[i]) < scenarioNumber(r.scenarios[j]) })
	for _, s := range r.scenarios {
		b.WriteString("| " + r.runtime + " | " + s + " |")
		for _, v := range kubeletVariants {
			res := r.result[[2]string{s, v.name}]
			if res == "" {
				res = "not run"
			}
			b.WriteString(" " + res + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestNode(t *testing.T) {
	k := needKube(t) // it grants the nodes nodeAudience too
	results := &nodeResults{runtime: testRig.Runtime.Name, result: map[[2]string]string{}}
	t.Cleanup(func() {
		table := results.markdown()
		fmt.Printf("\nNode end-to-end results (scenario x kubelet, on %s):\n\n%s\n", testRig.Runtime.Name, table)
		os.MkdirAll("../_output", 0o755)
		os.WriteFile("../_output/e2e-node-containerd-"+testRig.Runtime.Line+".md", []byte(table), 0o644)
	})
	for _, v := range kubeletVariants {
		t.Run(v.name, func(t *testing.T) { runNodeScenarios(t, k, v, results) })
	}
}

func runNodeScenarios(t *testing.T, k *kuberig.Kube, v kubeletVariant, results *nodeResults) {
	e := newNodeEnv(t, k, v)
	for _, sc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"1. A, pull secret: Running", e.scenarioSecret},
		{"2. B, no secret: ErrImagePull; Never: ErrImageNeverPull; CreateContainer refused", e.scenarioNoSecret},
		{"3. B, own valid secret: one registry round trip, then none", e.scenarioOwnSecret},
		{"4. public image: Running everywhere, never re-verified", e.scenarioPublic},
		{"5. proxy plugin credentials (node-wide): Running", e.scenarioPlugin},
		{"6. token plugin: SA verified once, another SA verifies", e.scenarioServiceAccount},
		{"7. proxy restarted and kill -9'd during pulls", e.scenarioRestarts},
		{"8. Always pulls a moved tag", e.scenarioAlways},
		{"9. control, the proxy not enforcing: B without a secret runs A's image unless the kubelet enforces", e.scenarioControl},
		{"10. B's image volume of A's image, no secret: ErrImagePull; Never: ErrImageNeverPull; never started", e.scenarioVolumeNoSecret},
		{"11. B's image volume with its own valid secret: Running, then re-used with no registry request", e.scenarioVolumeOwnSecret},
		{"12. crictl create with an image mount of a hidden image: refused", e.scenarioVolumeCrictl},
		{"13. the token plugin's required annotation removed from A's account: its new pod must pull, and cannot", e.scenarioRoleRemoved},
		{"14. A's pull secret rotated (same secret, new password): Running with no registry request", e.scenarioRotatedSecret},
		{"15. the database full: A's record cannot be written; B's pods never run", e.scenarioFullDatabase},
		{"16. the proxy's identity is the node's: no secret, account or token of a pod on another node; told from the kubelet in the audit log", e.scenarioNodeIdentity},
		{"17. doctor: the kubelet's endpoints are the proxy's socket and it called just now; a proxy on another socket is reported bypassed", e.scenarioDoctor},
		{"18. the DaemonSet, from the image hack/image built: Ready under the kubelet; serves its host socket, plugin and records; gone with its pod", e.scenarioDaemonSet},
		{"19. records in the kubelet's format: its records imported (secrets left behind); the proxy's exported and honoured by the kubelet alone", e.scenarioKubeletFormat},
	} {
		ran, skipped := false, false
		ok := t.Run(sc.name, func(t *testing.T) {
			ran = true
			defer func() { skipped = t.Skipped() }()
			sc.run(t)
		})
		if !ran { // left out by -run
			continue
		}
		res := "pass"
		switch {
		case !ok:
			res = "**FAIL**"
		case skipped:
			res = "n/a"
		}
		results.set(sc.name, v.name, res)
	}
}

// scenarioNumber is the number a scenario's name starts with.
func scenarioNumber(name string) int {
	n := 0
	fmt.Sscanf(name, "%d.", &n)
	return n
}
