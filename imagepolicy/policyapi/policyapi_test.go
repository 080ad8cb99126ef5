package policyapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	req := ImagePolicyRequest{
		Call: CallPullImage, Image: "registry.test/app:v1", Repository: "registry.test/app", Digest: "sha256:" + strings.Repeat("a", 64),
		Platform:   &Platform{OS: "linux", Architecture: "amd64"},
		Pod:        Pod{Namespace: "secure", Name: "web", UID: "u-1", ServiceAccount: "default", Static: true},
		Credential: &Credential{Username: "u", Password: "s3cret"},
	}
	b, err := EncodeRequest(V1alpha1, req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	req.APIVersion, req.Kind = V1alpha1, RequestKind
	if got.Pod != req.Pod || *got.Credential != *req.Credential || *got.Platform != *req.Platform || got.Digest != req.Digest || got.Call != req.Call {
		t.Errorf("got %+v, want %+v", got, req)
	}

	resp := Deny("no signature of release-key", "image is not signed")
	resp.CacheDuration = &metav1.Duration{Duration: time.Minute}
	b, err = EncodeResponse(V1alpha1, resp)
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeResponse(V1alpha1, b)
	if err != nil {
		t.Fatal(err)
	}
	if *r.Allowed || r.PodReason != "image is not signed" || r.CacheDuration.Duration != time.Minute {
		t.Errorf("got %+v", r)
	}
}

func TestDecodeResponse(t *testing.T) {
	t.Parallel()
	const head = `{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyResponse",`
	for _, tc := range []struct {
		name, in string
		want     string // in the error; empty: valid
	}{
		{"an allow with reasons is valid", head + `"allowed":true,"reason":"signed"}`, ""},
		{"a deny with a cache duration is valid", head + `"allowed":false,"podReason":"unsigned","cacheDuration":"30s"}`, ""},
		{"another apiVersion is refused", `{"apiVersion":"imagepolicy.cri-image-proxy.io/v1","kind":"ImagePolicyResponse","allowed":true}`, `apiVersion is "imagepolicy.cri-image-proxy.io/v1", want "` + V1alpha1 + `"`},
		{"another kind is refused", `{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest","allowed":true}`, `kind is "ImagePolicyRequest"`},
		{"a missing allowed is refused", head + `"reason":"hmm"}`, "allowed is missing"},
		{"allowed as a string is refused", head + `"allowed":"true"}`, "does not decode strictly"},
		{"an unknown field is refused", head + `"allowed":true,"allow":true}`, "does not decode strictly"},
		{"a duplicate field is refused", head + `"allowed":true,"allowed":false}`, "does not decode strictly"},
		{"a field in another case is refused", head + `"Allowed":true}`, "does not decode strictly"},
		{"a negative cache duration is refused", head + `"allowed":true,"cacheDuration":"-1s"}`, "negative"},
		{"a podReason of two lines is refused", head + `"allowed":false,"podReason":"a\nb"}`, "podReason holds a control character"},
		{"a long podReason is refused", head + `"allowed":false,"podReason":"` + strings.Repeat("x", MaxPodReason+1) + `"}`, "podReason is 257 bytes"},
		{"a reason of several lines is valid", head + `"allowed":false,"reason":"tried:\n\tkey a: no signature"}`, ""},
		{"garbage is refused without being quoted", `panic: s3cret`, "not a JSON object"},
		{"two objects are refused", head + `"allowed":true}` + head + `"allowed":true}`, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeResponse(V1alpha1, []byte(tc.in))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidResponse) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an ErrInvalidResponse with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error quotes the output: %v", err)
			}
		})
	}
}

func TestDecodeRequest(t *testing.T) {
	t.Parallel()
	const head = `{"apiVersion":"` + V1alpha1 + `","kind":"ImagePolicyRequest",`
	for _, tc := range []struct{ name, in, want string }{
		{"a pull with a digest is valid", head + `"call":"PullImage","image":"r.test/a:v1","digest":"sha256:aa","pod":{"namespace":"n"}}`, ""},
		{"a create with an image ID only is valid", head + `"call":"CreateContainer","image":"sha256:bb","imageID":"sha256:bb","pod":{"namespace":"n"}}`, ""},
		{"an unknown call is refused", head + `"call":"RemoveImage","image":"x","digest":"d","pod":{}}`, `call is "RemoveImage"`},
		{"a request with neither digest nor image ID is refused", head + `"call":"PullImage","image":"x","pod":{}}`, "neither digest nor imageID"},
		{"an unknown field is refused without quoting the credential", head + `"call":"PullImage","image":"x","digest":"d","pod":{},"credential":{"password":"s3cret","token":"s3cret"}}`, "does not decode strictly"},
		{"another version is refused", `{"apiVersion":"v9","kind":"ImagePolicyRequest"}`, `apiVersion is "v9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRequest([]byte(tc.in))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("got %v, want an ErrInvalidRequest with %q", err, tc.want)
			}
		})
	}
}
