package podtoken

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// API is what a Source reads and writes in the Kubernetes API: pods,
// service accounts, their tokens and secrets, all in core v1. NewAPI is the
// real one; podtokentest adapts client-go's fake clientset for tests.
type API interface {
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)
	CreateToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
	GetSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

// restAPI is API on client-go's REST client, with a scheme of only the
// types it uses. The generated clientset (k8s.io/client-go/kubernetes)
// would do the same calls but links every API group of Kubernetes: +55 MB
// of binary and +17 MiB of resident memory, measured, in a daemon whose
// budget is 64 MiB and which only needs pods, service accounts, secrets
// and token requests. Requests, retries, authentication (exec plugins
// included), rate limits and metrics are client-go's.
type restAPI struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

// NewAPI returns the API on cfg's server.
func NewAPI(cfg *rest.Config) (API, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, authenticationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	// Protobuf, as the kubelet asks for its pods: decoding the node's pod
	// watch as JSON was a sixth of the proxy's CPU while a 110-pod storm
	// started. (Every type here is built in; JSON stays acceptable.)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &restAPI{rc: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

func (a *restAPI) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := a.rc.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := a.rc.Get().Resource("pods").VersionedParams(&opts, a.params).Timeout(timeout(opts)).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return a.rc.Get().Resource("pods").VersionedParams(&opts, a.params).Timeout(timeout(opts)).Watch(ctx)
}

func (a *restAPI) GetServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	out := &corev1.ServiceAccount{}
	err := a.rc.Get().Namespace(namespace).Resource("serviceaccounts").Name(name).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) CreateToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	out := &authenticationv1.TokenRequest{}
	err := a.rc.Post().Namespace(namespace).Resource("serviceaccounts").Name(name).SubResource("token").
		Body(req).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) GetSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	out := &corev1.Secret{}
	err := a.rc.Get().Namespace(namespace).Resource("secrets").Name(name).Do(ctx).Into(out)
	return out, err
}

// timeout is a list or watch's server-side timeout as a client deadline,
// as the generated clients set it.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
