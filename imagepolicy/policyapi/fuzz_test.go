package policyapi

import (
	"errors"
	"strings"
	"testing"
)

// FuzzDecodeResponse: whatever a plugin prints, decoding returns a valid
// response or an ErrInvalidResponse that never quotes the output beyond
// its apiVersion and kind.
func FuzzDecodeResponse(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","allowed":true,"reason":"signed by release-key"}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","allowed":false,"reason":"SECRETX","podReason":"unsigned","cacheDuration":"1m"}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","allowed":true,"password":"SECRETX"}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","allowed":true,"allowed":false}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","podReason":"a\nb","allowed":false}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse","allowed":"SECRETX"}`,
		`SECRETX`, `{}`, `[]`, `{"apiVersion":1}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		resp, err := DecodeResponse(V1alpha1, data)
		if err != nil {
			if !errors.Is(err, ErrInvalidResponse) {
				t.Fatalf("error %v is not ErrInvalidResponse", err)
			}
			if strings.Contains(err.Error(), "SECRETX") {
				t.Fatalf("the error quotes the plugin's output: %v", err)
			}
			return
		}
		if resp.Allowed == nil || resp.APIVersion != V1alpha1 || resp.Kind != ResponseKind {
			t.Fatalf("accepted %+v", resp)
		}
		if len(resp.PodReason) > MaxPodReason || strings.ContainsAny(resp.PodReason, "\n\r") {
			t.Fatalf("accepted podReason %q", resp.PodReason)
		}
		if resp.CacheDuration != nil && resp.CacheDuration.Duration < 0 {
			t.Fatal("accepted a negative cacheDuration")
		}
	})
}

// FuzzDecodeRequest: whatever a plugin is given, decoding returns a valid
// request or an ErrInvalidRequest that never quotes the credential.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest","call":"PullImage","image":"r.test/app:v1","repository":"r.test/app","digest":"sha256:aa","pod":{"namespace":"secure"},"credential":{"username":"u","password":"SECRETX"}}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest","call":"CreateContainer","image":"sha256:aa","imageID":"sha256:aa","pod":{"namespace":"n","static":true}}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest","call":"Nope","image":"x","digest":"d","pod":{},"credential":{"password":"SECRETX","token":"SECRETX"}}`,
		`{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest","call":"PullImage","image":"x","pod":{}}`,
		`SECRETX`, `{}`, `{"kind":7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v is not ErrInvalidRequest", err)
			}
			if strings.Contains(err.Error(), "SECRETX") {
				t.Fatalf("the error quotes the request: %v", err)
			}
			return
		}
		if ValidateRequest(req) != nil || req.Kind != RequestKind {
			t.Fatalf("accepted %+v", req)
		}
	})
}
