package keyring

import (
	"strings"
	"testing"
)

// FuzzParseDockerConfig: a pull secret is tenant input. Whatever its
// content, parsing either fails with an error that does not quote it, or
// gives credentials that match only what their keys say.
func FuzzParseDockerConfig(f *testing.F) {
	for _, s := range []string{
		`{"auths":{"registry.test":{"auth":"YWxpY2U6U0VDUkVUWA=="}}}`,
		`{"auths":{"https://registry.test/v1/":{"username":"u","password":"SECRETX"}}}`,
		`{"auths":{"*.test":{"auth":"!!!SECRETX"}}}`,
		`{"registry.test":{"auth":"YWxpY2U6U0VDUkVUWA=="}}`,
		`SECRETX`, `{}`, `null`, `{"auths":null}`, `{"auths":{"":{}}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, legacy bool) {
		parse := ParseDockerConfig
		if legacy {
			parse = ParseDockercfg
		}
		cfg, err := parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "SECRETX") {
				t.Fatalf("the error quotes the secret: %v", err)
			}
			return
		}
		for _, image := range []string{"registry.test/team/app", "docker.io/library/nginx", "other.test/x"} {
			for _, c := range cfg.Credentials(image) {
				_ = c.Username + c.Password
			}
		}
	})
}
