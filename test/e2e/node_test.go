package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
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
	// name is its subtest's name and a column of the result table: no
	// slash, so that -run selects it ('^TestNode$/v1.31.4/^7\.').
	name    string
	id      string // a prefix for its namespaces and images
	version string
	gates   map[string]bool
}

var kubeletVariants = []kubeletVariant{
	{name: kuberig.KubeVersion + " (its ensure off)", id: "cur-off", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": false}},
	{name: kuberig.KubeVersion + " (its ensure on)", id: "cur-on", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": true}},
	{name: kuberig.OldKubeVersion + " (no KEP-2535, no KEP-4412)", id: "old", version: kuberig.OldKubeVersion},
}

// nodeAudience is the token plugin's audience in the node tests; the node
// may request it through token-audiences.yaml.
const nodeAudience = "registry.node.test"

// A nodeScenario is one row of the node result table. It runs on each
// kubelet in turn, on that kubelet's node, after the scenarios before it in
// nodeScenarios, and also alone: -run '^TestNode$/VARIANT/^N\.' runs
// scenario N by itself. A scenario that builds on an earlier one (A's pull
// of scenario 1, say) makes what it needs itself, the same way, where that
// scenario did not run (nodeEnv.ensureRunning), and its comment says so;
// the images of every scenario are pushed before the kubelet starts,
// whatever runs.
type nodeScenario struct {
	// name is the row's text; its number is its place in nodeScenarios.
	// No slash: it is the subtest's name after the number.
	name string
	// needs are what the kubelet and the runtime must offer; where one is
	// missing, the scenario is n/a.
	needs []nodeNeed
	// images are the images it pulls, as paths under the kubelet's
	// repository (e.image(path) is the reference): they are pushed for each
	// kubelet before it starts, so that no kubelet has seen them. Images
	// the scenario pushes itself, as part of what it tests, are not here.
	images []string
	run    func(e *nodeEnv, t *testing.T)
}

// nodeScenarios are the node scenarios in the order they run on each
// kubelet. A scenario's number, in the result table and in the docs ("node
// scenario 15"), is its place here: a new one goes at the end. A scenario
// is a nodeScenario value in the file of its theme (node_*_test.go), its
// run a method of nodeEnv beside it; nodeEnv (node_env_test.go) has the
// node, the tenants and the pod helpers.
var nodeScenarios = []nodeScenario{
	secretScenario,          // 1, node_secrets_test.go
	noSecretScenario,        // 2
	ownSecretScenario,       // 3
	publicScenario,          // 4
	pluginScenario,          // 5, node_plugins_test.go
	serviceAccountScenario,  // 6
	restartsScenario,        // 7, node_faults_test.go
	alwaysScenario,          // 8, node_secrets_test.go
	controlScenario,         // 9, node_control_test.go
	volumeNoSecretScenario,  // 10, node_volumes_test.go
	volumeOwnSecretScenario, // 11
	volumeCrictlScenario,    // 12
	roleRemovedScenario,     // 13, node_plugins_test.go
	rotatedSecretScenario,   // 14, node_secrets_test.go
	fullDatabaseScenario,    // 15, node_faults_test.go
	nodeIdentityScenario,    // 16, node_identity_test.go
	doctorScenario,          // 17
	daemonSetScenario,       // 18, node_daemonset_test.go
	kubeletFormatScenario,   // 19, node_records_test.go
	staticPodPolicyScenario, // 20, node_policy_test.go
	kubeletRestartScenario,  // 21, node_faults_test.go
	mirrorScenario,          // 22, node_registrycheck_test.go
	manifestOnlyScenario,    // 23
	forgedConfigScenario,    // 24
	preloadedScenario,       // 25, node_preloaded_test.go
}

// title is the scenario's subtest name and row: its number, then its name.
func (sc nodeScenario) title(i int) string { return fmt.Sprintf("%d. %s", i+1, sc.name) }

// missing says what of its needs v lacks ("" when it has them all).
func (sc nodeScenario) missing(v kubeletVariant) string {
	for _, need := range sc.needs {
		if why := need(v); why != "" {
			return why
		}
	}
	return ""
}

// A nodeNeed is what a scenario needs of a kubelet or the runtime: it
// says why v lacks it, or "".
type nodeNeed func(v kubeletVariant) string

// imageVolumes: KEP-4639, beta and on by default from kubelet 1.35 (the
// old kubelet has it alpha and off) and containerd 2.1.
func imageVolumes(v kubeletVariant) string {
	if v.version == kuberig.OldKubeVersion {
		return fmt.Sprintf("kubelet %s has no image volumes (ImageVolume alpha, off)", v.version)
	}
	if testRig.Runtime.Legacy() {
		return fmt.Sprintf("%s has no image volumes (containerd 2.1+)", testRig.Runtime.Name)
	}
	return ""
}

// containerdRuntime: deploy/kubernetes/daemonset.yaml mounts containerd's
// socket directory and names its socket.
func containerdRuntime(kubeletVariant) string {
	if testRig.Runtime.CRIO() {
		return fmt.Sprintf("the DaemonSet's manifest runs in front of containerd (/run/containerd), not %s", testRig.Runtime.Name)
	}
	return ""
}

// kubeletRecords: the kubelet keeps KEP-2535 records of its own.
func kubeletRecords(v kubeletVariant) string {
	if !v.gates["KubeletEnsureSecretPulledImages"] {
		return "this kubelet keeps no KEP-2535 records"
	}
	return ""
}

// nodeResults is the scenario x kubelet table the node tests print.
type nodeResults struct {
	runtime string
	mu      sync.Mutex
	result  map[[2]int]string // [scenario, kubelet variant]: pass, **FAIL** or n/a
}

func (r *nodeResults) set(scenario, variant int, result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.result[[2]int{scenario, variant}] = result
}

// markdown is the table: a row for each scenario that ran on some kubelet.
func (r *nodeResults) markdown() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("| runtime | scenario |")
	for _, v := range kubeletVariants {
		b.WriteString(" kubelet " + v.name + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(kubeletVariants)) + "\n")
	for i, sc := range nodeScenarios {
		row := []string{r.runtime, sc.title(i)}
		ran := false
		for j := range kubeletVariants {
			res, ok := r.result[[2]int{i, j}]
			if !ok {
				res = "not run"
			}
			ran = ran || ok
			row = append(row, res)
		}
		if ran {
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
	}
	return b.String()
}

// TestNodeSubtestNamesAreSelectable: no kubelet variant or scenario name
// holds a slash, which -run reads as a level of subtests: each variant,
// and each scenario by its number, is selected by '^TestNode$/VARIANT/^N\.'.
func TestNodeSubtestNamesAreSelectable(t *testing.T) {
	for _, v := range kubeletVariants {
		if strings.Contains(v.name, "/") {
			t.Errorf("kubelet variant %q: a slash in a subtest name", v.name)
		}
	}
	for i, sc := range nodeScenarios {
		if strings.Contains(sc.title(i), "/") {
			t.Errorf("node scenario %q: a slash in a subtest name", sc.title(i))
		}
	}
}

func TestNode(t *testing.T) {
	k := needKube(t) // it grants the nodes nodeAudience too
	results := &nodeResults{runtime: testRig.Runtime.Name, result: map[[2]int]string{}}
	t.Cleanup(func() {
		table := results.markdown()
		fmt.Printf("\nNode end-to-end results (scenario x kubelet, on %s):\n\n%s\n", testRig.Runtime.Name, table)
		os.MkdirAll("../../_output", 0o755)
		os.WriteFile("../../_output/e2e-node-"+testRig.Runtime.Kind+"-"+testRig.Runtime.Line+".md", []byte(table), 0o644)
	})
	for j, v := range kubeletVariants {
		t.Run(v.name, func(t *testing.T) { runNodeScenarios(t, k, j, results) })
	}
}

// runNodeScenarios starts the node of kubeletVariants[j], with the images
// of the scenarios it can run, and runs every scenario on it in order.
func runNodeScenarios(t *testing.T, k *kuberig.Kube, j int, results *nodeResults) {
	v := kubeletVariants[j]
	var images []string
	for _, sc := range nodeScenarios {
		if sc.missing(v) == "" {
			images = append(images, sc.images...)
		}
	}
	slices.Sort(images)
	e := newNodeEnv(t, k, v, slices.Compact(images))
	for i, sc := range nodeScenarios {
		ran, skipped := false, false
		ok := t.Run(sc.title(i), func(t *testing.T) {
			ran = true
			defer func() { skipped = t.Skipped() }()
			if why := sc.missing(v); why != "" {
				t.Skip("n/a: " + why)
			}
			sc.run(e, t)
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
		results.set(i, j, res)
	}
}
