package pluginapi

import (
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeResponse: whatever a plugin prints, decoding returns a valid
// response or an ErrInvalidResponse that never quotes its auth entries or
// the raw output (it may name the apiVersion, kind or cacheKeyType).
func FuzzDecodeResponse(f *testing.F) {
	const v1 = "credentialprovider.kubelet.k8s.io/v1"
	for _, s := range []string{
		`{"apiVersion":"` + v1 + `","kind":"CredentialProviderResponse","cacheKeyType":"Registry","auth":{"r.test":{"username":"u","password":"SECRETX"}}}`,
		`{"apiVersion":"` + v1 + `","kind":"CredentialProviderResponse","cacheKeyType":"Image","cacheDuration":"5m"}`,
		`{"apiVersion":"` + v1 + `","kind":"CredentialProviderResponse","cacheKeyType":"Nope","auth":{"SECRETX":{}}}`,
		`{"apiVersion":"` + v1 + `","kind":"CredentialProviderResponse","cacheKeyType":"Global","auth":{"r":{"username":"u","password":"p","extra":"SECRETX"}}}`,
		`SECRETX`, `{}`, `[]`, `{"apiVersion":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		resp, err := DecodeResponse(v1, data)
		if err != nil {
			if !errors.Is(err, ErrInvalidResponse) {
				t.Fatalf("error %v is not ErrInvalidResponse", err)
			}
			if strings.Contains(err.Error(), "SECRETX") {
				t.Fatalf("the error quotes the plugin's output: %v", err)
			}
			return
		}
		switch resp.CacheKeyType {
		case "Image", "Registry", "Global":
		default:
			t.Fatalf("accepted cacheKeyType %q", resp.CacheKeyType)
		}
		if resp.CacheDuration != nil && resp.CacheDuration.Duration < 0 {
			t.Fatalf("accepted a negative duration")
		}
	})
}
