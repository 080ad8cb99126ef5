package ensure

import (
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// Interceptors returns the guard's CRI interceptors, for criproxy.New,
// one per intercepted method, each the adapter of one file
// (image_status.go, image_pull.go, ...). The guard's PullImage is the only
// interceptor on its method: it runs credential injection's tries and the
// registry check of each itself (GuardOptions.Credentials, Registry), so
// criproxy.New refuses another beside it. Intercepting one more method is
// one more such file and one more line here.
func (g *Guard) Interceptors() []criproxy.Interceptor {
	return []criproxy.Interceptor{
		criproxy.InterceptFiltered(criproxy.ImageStatus, g.ImageStatus, g.WantsImageStatus),
		criproxy.Intercept(criproxy.PullImage, g.PullImage).Sole(),
		criproxy.Intercept(criproxy.RemoveImage, g.RemoveImage),
		criproxy.Intercept(criproxy.CreateContainer, g.CreateContainer),
		criproxy.Intercept(criproxy.RemovePodSandbox, g.RemovePodSandbox),
		criproxy.Intercept(criproxy.Status, g.Status),
	}
}
