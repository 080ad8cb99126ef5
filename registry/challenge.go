package registry

import (
	"net/http"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/remotes/docker/auth"
)

// challenge is a registry endpoint's auth challenge as it is remembered:
// the scheme, realm and service. A challenge's scope and error belong to
// the one request that got it and are dropped; nothing in it comes from a
// credential.
type challenge struct {
	scheme  auth.AuthenticationScheme
	realm   string
	service string
}

// challengeFrom picks, from a 401's WWW-Authenticate headers, the challenge
// containerd's authorizer would answer: bearer before basic (containerd's
// parser sorts them), a bearer challenge only with a realm.
func challengeFrom(h http.Header) (challenge, bool) {
	for _, c := range auth.ParseAuthHeader(h) {
		switch c.Scheme {
		case auth.BearerAuth:
			if c.Parameters["realm"] == "" {
				continue
			}
			return challenge{scheme: c.Scheme, realm: c.Parameters["realm"], service: c.Parameters["service"]}, true
		case auth.BasicAuth:
			return challenge{scheme: c.Scheme, realm: c.Parameters["realm"]}, true
		}
	}
	return challenge{}, false
}

// header is the challenge as a WWW-Authenticate value that containerd's
// parser reads back to the same challenge: how a remembered challenge seeds
// a new authorizer.
func (c challenge) header() string {
	name := "Basic"
	if c.scheme == auth.BearerAuth {
		name = "Bearer"
	}
	b := name + ` realm="` + quoteParam(c.realm) + `"`
	if c.service != "" {
		b += `,service="` + quoteParam(c.service) + `"`
	}
	return b
}

func (c challenge) String() string {
	if c.scheme == auth.BearerAuth {
		return "bearer, realm " + c.realm + ", service " + c.service
	}
	return "basic"
}

var paramEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

func quoteParam(s string) string { return paramEscaper.Replace(s) }

// challengeMemory remembers the last challenge of each endpoint, so that a
// check with a new credential sends it at once instead of paying a 401
// round first. Bounded: past maxEndpoints it forgets everything (a node
// asks few registries). Safe for concurrent use.
type challengeMemory struct {
	mu sync.Mutex
	m  map[string]challenge
}

const maxEndpoints = 1024

func (cm *challengeMemory) get(endpoint string) (challenge, bool) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	c, ok := cm.m[endpoint]
	return c, ok
}

func (cm *challengeMemory) remember(endpoint string, c challenge) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.m == nil || len(cm.m) >= maxEndpoints {
		cm.m = map[string]challenge{}
	}
	cm.m[endpoint] = c
}
