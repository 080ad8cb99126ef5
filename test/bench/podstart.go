package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// The pod start benchmark: the latency a user feels, from the pod's
// creation in the API to its container Running, with a real kubelet on
// the proxy (ensure on, with the API) and the same kubelet on containerd
// directly. The image is present and the pods are a re-using tenant's:
// through the proxy each start is a hidden ImageStatus, a PullImage
// answered from the node, a granted CreateContainer.
const podStartNamespace = "podstart"

// podStartMeasurement starts n pods per arm.
func podStartMeasurement(n int) measurement {
	return measurement{name: "pod start", needs: []part{kubeAPI}, run: func(e *benchEnv, rep *report) error {
		e.logf("pod start: %d pods per arm with a real kubelet", n)
		ps, err := e.podStart(n)
		if err != nil {
			return err
		}
		section, ratio := renderPodStart(ps)
		rep.sections = append(rep.sections, section)
		rep.extra = append(rep.extra, extraTarget{desc: "pod start p50, kubelet on the proxy / on containerd (goal 1.02)", value: ratio, max: 1.02})
		return nil
	}}
}

// podStartResult is one arm's latencies.
type podStartResult struct {
	arm       string
	latencies []time.Duration
}

func (r podStartResult) quantile(q float64) time.Duration { return quantile(r.latencies, q) }

// podStartBlocks is how many blocks each arm runs: the arms alternate
// (proxy, direct, proxy, ...) so that drift of the machine hits both alike;
// each block costs a kubelet start.
const podStartBlocks = 4

// podStart runs n pods per arm, in alternating blocks.
func (e *benchEnv) podStart(n int) ([]podStartResult, error) {
	k := e.token.kube
	ctx := context.Background()
	if err := k.CreateNamespace(ctx, podStartNamespace); err != nil {
		return nil, err
	}
	secret, _ := json.Marshal(map[string]any{"auths": map[string]any{e.rig.Registry: map[string]string{"username": "alice", "password": rig.Users["alice"]}}})
	if _, err := k.Admin.CoreV1().Secrets(podStartNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
		Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: secret}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := e.rig.PushBusybox("podstart/app:v1", "podstart"); err != nil {
		return nil, err
	}
	image := e.rig.Registry + "/podstart/app:v1"
	kubeconfig, err := k.WriteKubeconfig(kuberig.NodeUser)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(e.rig.Dir, "bench-podstart.sock")
	proxy, err := e.rig.StartProxy(e.opts.proxy, sock, "--log-level", "info", "--ensure-secret-pulled-images",
		"--ensure-database", filepath.Join(e.work, "podstart.db"), "--admin-socket", filepath.Join(e.work, "podstart-admin.sock"),
		"--kubeconfig", kubeconfig, "--node-name", kuberig.NodeName)
	if err != nil {
		return nil, err
	}
	defer proxy.Stop(10 * time.Second)

	results := []podStartResult{{arm: "kubelet on the proxy (ensure on, API)"}, {arm: "kubelet on containerd directly"}}
	endpoints := []string{"unix://" + sock, "unix://" + e.rig.RuntimeSock}
	block := (n + podStartBlocks - 1) / podStartBlocks
	seq := 0
	for round := range podStartBlocks {
		for arm := range results {
			node, err := kuberig.StartNode(e.rig, k, kuberig.KubeletOptions{Bin: kuberig.KubeletBin(e.rig, kuberig.KubeVersion), CRIEndpoint: endpoints[arm]})
			if err != nil {
				return nil, err
			}
			// The first pod after a kubelet start is slower everywhere, and the
			// very first one pulls the image (tenant A verifies): not measured.
			for i := -1; i < block; i++ {
				seq++
				d, err := startPod(ctx, k, fmt.Sprintf("p%03d", seq), image)
				if err != nil {
					node.Stop()
					return nil, fmt.Errorf("%s, round %d: %w\nkubelet log:\n%s", results[arm].arm, round, err, tail(node.Log(), 30))
				}
				if i >= 0 {
					results[arm].latencies = append(results[arm].latencies, d)
				}
			}
			deletePods(ctx, k)
			node.Stop()
			if err := kuberig.RemoveKubeletPods(ctx, e.rig); err != nil {
				return nil, err
			}
			e.logf("pod start: %s, round %d: %d pods, p50 %v", results[arm].arm, round+1, block, results[arm].quantile(0.5).Round(time.Millisecond))
		}
	}
	return results, nil
}

// startPod creates a pod of tenant A (its pull secret, IfNotPresent) and
// returns how long it took until its container ran, as the API reports it.
func startPod(ctx context.Context, k *kuberig.Kube, name, image string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	w, err := k.Admin.CoreV1().Pods(podStartNamespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	no, zero := false, int64(0)
	start := time.Now()
	_, err = k.Admin.CoreV1().Pods(podStartNamespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: kuberig.NodeName, AutomountServiceAccountToken: &no, DNSPolicy: corev1.DNSDefault,
			TerminationGracePeriodSeconds: &zero, ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
			Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sleep", "3600"}}}}},
		metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return 0, fmt.Errorf("watch: %v", apierrors.FromObject(ev.Object))
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.State.Running != nil {
				return time.Since(start), nil
			}
			if w := st.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "" {
				return 0, fmt.Errorf("pod %s: %s: %s", name, w.Reason, w.Message)
			}
		}
	}
	return 0, fmt.Errorf("pod %s not Running within 2 minutes", name)
}

// deletePods deletes the benchmark's pods while the kubelet runs (it stops
// their containers) and waits until they are gone.
func deletePods(ctx context.Context, k *kuberig.Kube) {
	zero := int64(0)
	pods := k.Admin.CoreV1().Pods(podStartNamespace)
	pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	for range 240 {
		if l, err := pods.List(ctx, metav1.ListOptions{}); err == nil && len(l.Items) == 0 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// renderPodStart writes the pod start table and returns the p50 ratio.
func renderPodStart(rs []podStartResult) (string, float64) {
	var b strings.Builder
	b.WriteString("\n## Pod start latency (a real kubelet " + kuberig.KubeVersion + ")\n\n")
	b.WriteString("From the pod's creation in the API to its container Running; image present, a re-using tenant (pull secret, IfNotPresent), pods started one at a time in alternating blocks.\n\n")
	b.WriteString("| arm | pods | p50 ms | p99 ms | p50 ratio | p99 ratio |\n|---|---|---|---|---|---|\n")
	base := rs[len(rs)-1]
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %.3f | %.3f |\n", r.arm, len(r.latencies), ms(r.quantile(0.5)), ms(r.quantile(0.99)),
			float64(r.quantile(0.5))/float64(base.quantile(0.5)), float64(r.quantile(0.99))/float64(base.quantile(0.99)))
	}
	return b.String(), float64(rs[0].quantile(0.5)) / float64(base.quantile(0.5))
}
