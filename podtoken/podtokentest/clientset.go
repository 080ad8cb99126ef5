package podtokentest

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/watchlist"

	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
)

// API returns cs as a podtoken.API.
func API(cs kubernetes.Interface) podtoken.API { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

// IsWatchListSemanticsUnSupported passes on whether cs can stream an
// initial list (the fake clientset cannot), so that informers on this API
// fall back to list-then-watch.
func (c clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.cs)
}

func (c clientset) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	return c.cs.CoreV1().Pods("").List(ctx, opts)
}

func (c clientset) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return c.cs.CoreV1().Pods("").Watch(ctx, opts)
}

func (c clientset) GetServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	return c.cs.CoreV1().ServiceAccounts(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) CreateToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return c.cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
}

func (c clientset) GetSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return c.cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}
