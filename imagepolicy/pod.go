package imagepolicy

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// configSourceAnnotation is where the kubelet says where a pod came from
// (kubetypes.ConfigSourceAnnotationKey): "api" for pods of the API
// server, "file" or "http" for static pods. The kubelet copies a pod's
// annotations into its sandbox config.
const configSourceAnnotation = "kubernetes.io/config.source"

// PodFromSandbox is the pod of a CRI sandbox config: namespace, name and
// UID from its metadata, static from the kubelet's config.source
// annotation. The service account is not in the CRI: callers with the API
// fill it in. A nil config (crictl pull without --pod-config) is no pod.
func PodFromSandbox(cfg *runtimeapi.PodSandboxConfig) Pod {
	md := cfg.GetMetadata()
	src := cfg.GetAnnotations()[configSourceAnnotation]
	return Pod{
		Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid(),
		Static: src == "file" || src == "http",
	}
}
