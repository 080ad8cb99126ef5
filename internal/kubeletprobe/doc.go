// Package kubeletprobe finds the CRI endpoints a running kubelet uses, as
// the kubelet itself resolves them: its flags over the drop-ins of its
// --config-dir (in name order) over its --config file over the default
// (kubeletConfigFlagPrecedence). It reads the process's command line and
// its files through /proc/PID (root and working directory), so that it
// sees what that kubelet sees, from a container too. It changes nothing.
//
// cri-image-proxy doctor uses it to tell an operator whether the kubelet
// really calls the proxy, or bypasses it (the drop-in overridden, or
// containerRuntimeEndpoint in the KubeletConfiguration pointing at the
// runtime).
package kubeletprobe
