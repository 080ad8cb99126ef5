package ensure

import (
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// Interceptors returns the guard's CRI interceptors, for criproxy.New,
// one per intercepted method, each the adapter of one file
// (image_status.go, image_pull.go, ...). The guard is the outermost hook
// of a PullImage: it must see what the credential injection inside it did.
// Intercepting one more method is one more such file and one more line
// here.
func (g *Guard) Interceptors() []criproxy.Interceptor {
	return []criproxy.Interceptor{
		criproxy.InterceptFiltered(criproxy.ImageStatus, g.ImageStatus, g.WantsImageStatus),
		criproxy.Intercept(criproxy.PullImage, g.PullImage),
		criproxy.Intercept(criproxy.RemoveImage, g.RemoveImage),
		criproxy.Intercept(criproxy.CreateContainer, g.CreateContainer),
		criproxy.Intercept(criproxy.RemovePodSandbox, g.RemovePodSandbox),
		criproxy.Intercept(criproxy.Status, g.Status),
	}
}

// InnerInterceptors returns the guard's innermost hooks, to go after
// credential injection: the registry check of each try of a pull (Verify),
// when the guard has a registry check.
func (g *Guard) InnerInterceptors() []criproxy.Interceptor {
	if g.registry == nil {
		return nil
	}
	return []criproxy.Interceptor{criproxy.Intercept(criproxy.PullImage, g.VerifyPullImage)}
}
