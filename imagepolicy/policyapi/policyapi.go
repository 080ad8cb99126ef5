package policyapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
)

// The versions and kinds of the API.
const (
	// V1alpha1 is the only apiVersion today.
	V1alpha1     = "imagepolicy.cri-image-proxy.io/v1alpha1"
	RequestKind  = "ImagePolicyRequest"
	ResponseKind = "ImagePolicyResponse"
)

// Bounds of a response's reasons.
const (
	// MaxReason bounds the operator's reason.
	MaxReason = 4096
	// MaxPodReason bounds the pod's reason, which ends up in the pod's
	// status (the kubelet's ErrImagePull or CreateContainerError message).
	MaxPodReason = 256
)

// Call says where the proxy asks.
type Call string

// The calls.
const (
	// CallPullImage: before the runtime pulls; the digest was resolved at
	// the registry and the pull is pinned to it.
	CallPullImage Call = "PullImage"
	// CallCreateContainer: the container's own image.
	CallCreateContainer Call = "CreateContainer"
	// CallImageVolume: an image mounted as a volume (KEP-4639) of a
	// container being created.
	CallImageVolume Call = "ImageVolume"
)

// Calls lists the calls, for validation messages.
func Calls() []string {
	return []string{string(CallPullImage), string(CallCreateContainer), string(CallImageVolume)}
}

// ImagePolicyRequest is what the proxy asks a plugin, on its stdin.
type ImagePolicyRequest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// Call is where the proxy asks: PullImage, CreateContainer or
	// ImageVolume.
	Call Call `json:"call"`
	// Image is the image as the request names it: a reference by tag or
	// digest, an image ID or a prefix of one.
	Image string `json:"image"`
	// Repository is the normalized repository ("registry.test/team/app"),
	// when the image is known under one; empty for an image known by ID
	// only.
	Repository string `json:"repository,omitempty"`
	// Digest is the manifest digest ("sha256:..."): at PullImage the one
	// resolved at the registry, which the pull is pinned to; at create, the
	// one the runtime recorded for Repository. Empty when unknown.
	Digest string `json:"digest,omitempty"`
	// ImageID is the image's ID (its config digest) when known: always at
	// create, at PullImage only when the proxy already knows it.
	ImageID string `json:"imageID,omitempty"`
	// Platform is the platform the runtime pulls and runs.
	Platform *Platform `json:"platform,omitempty"`
	// Pod is the pod the image is for.
	Pod Pod `json:"pod"`
	// Credential is the pull's registry credential, given only to plugins
	// whose configuration allows it (to read signatures from a private
	// registry). Never log it.
	Credential *Credential `json:"credential,omitempty"`
}

// Platform is an OCI platform.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

// Pod is the pod an image is for. A pull without a pod (crictl, a bake
// job) has only a namespace: the pod config's, or the node default.
type Pod struct {
	Namespace      string `json:"namespace"`
	Name           string `json:"name,omitempty"`
	UID            string `json:"uid,omitempty"`
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Static is true for a static pod: a manifest file on the node, no API
	// object, the case admission webhooks never see.
	Static bool `json:"static,omitempty"`
}

// Credential is a registry credential.
type Credential struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// String never shows the password.
func (c Credential) String() string { return "username " + c.Username + " (password not shown)" }

// ImagePolicyResponse is a plugin's verdict, on its stdout.
type ImagePolicyResponse struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// Allowed is the verdict; required.
	Allowed *bool `json:"allowed"`
	// Reason is for the operator: the proxy logs it and explain shows it.
	Reason string `json:"reason,omitempty"`
	// PodReason is for the pod: short, one line, no secret.
	PodReason string `json:"podReason,omitempty"`
	// CacheDuration, when set, is how long this verdict is cached, in place
	// of the provider's configured duration; 0 means not cached.
	CacheDuration *metav1.Duration `json:"cacheDuration,omitempty"`
}

// Errors of decoding.
var (
	// ErrInvalidRequest marks a request a plugin must refuse.
	ErrInvalidRequest = errors.New("invalid image policy request")
	// ErrInvalidResponse marks a plugin answer the proxy refuses; its
	// message never quotes the answer.
	ErrInvalidResponse = errors.New("invalid image policy response")
)

// typeMeta is read first, to refuse another version or kind before
// decoding anything else.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// Supported reports whether apiVersion is a version of this API.
func Supported(apiVersion string) bool { return apiVersion == V1alpha1 }

// SupportedAPIVersions lists the versions.
func SupportedAPIVersions() []string { return []string{V1alpha1} }

// EncodeRequest encodes req in apiVersion, filling apiVersion and kind:
// the proxy's side. The result may hold a credential.
func EncodeRequest(apiVersion string, req ImagePolicyRequest) ([]byte, error) {
	if !Supported(apiVersion) {
		return nil, fmt.Errorf("apiVersion %q is not supported", apiVersion)
	}
	req.APIVersion, req.Kind = apiVersion, RequestKind
	return json.Marshal(req)
}

// DecodeResponse decodes and validates a plugin's stdout: apiVersion equal
// to the request's, kind ImagePolicyResponse, strict fields, allowed set,
// reasons within bounds, cacheDuration not negative.
func DecodeResponse(apiVersion string, data []byte) (*ImagePolicyResponse, error) {
	var tm typeMeta
	if err := json.Unmarshal(data, &tm); err != nil {
		// The JSON error may quote the output: say only what is wrong.
		return nil, fmt.Errorf("%w: not a JSON object with apiVersion and kind", ErrInvalidResponse)
	}
	if tm.APIVersion != apiVersion {
		return nil, fmt.Errorf("%w: apiVersion is %q, want %q (the request's)", ErrInvalidResponse, clip(tm.APIVersion), apiVersion)
	}
	if tm.Kind != ResponseKind {
		return nil, fmt.Errorf("%w: kind is %q, want %s", ErrInvalidResponse, clip(tm.Kind), ResponseKind)
	}
	var resp ImagePolicyResponse
	if err := unmarshalStrict(data, &resp); err != nil {
		return nil, fmt.Errorf("%w: it does not decode strictly as %s %s (unknown or duplicate field, or wrong type)", ErrInvalidResponse, apiVersion, ResponseKind)
	}
	if resp.Allowed == nil {
		return nil, fmt.Errorf("%w: allowed is missing: it must say true or false", ErrInvalidResponse)
	}
	if err := checkText("reason", resp.Reason, MaxReason, true); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResponse, err)
	}
	if err := checkText("podReason", resp.PodReason, MaxPodReason, false); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResponse, err)
	}
	if d := resp.CacheDuration; d != nil && d.Duration < 0 {
		return nil, fmt.Errorf("%w: cacheDuration %v is negative", ErrInvalidResponse, d.Duration)
	}
	return &resp, nil
}

// DecodeRequest decodes and validates a request strictly: the plugin's
// side. Its errors never quote the request, which may hold a credential.
func DecodeRequest(data []byte) (*ImagePolicyRequest, error) {
	var tm typeMeta
	if err := json.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object with apiVersion and kind", ErrInvalidRequest)
	}
	if !Supported(tm.APIVersion) {
		return nil, fmt.Errorf("%w: apiVersion is %q, want one of %s", ErrInvalidRequest, clip(tm.APIVersion), strings.Join(SupportedAPIVersions(), ", "))
	}
	if tm.Kind != RequestKind {
		return nil, fmt.Errorf("%w: kind is %q, want %s", ErrInvalidRequest, clip(tm.Kind), RequestKind)
	}
	var req ImagePolicyRequest
	if err := unmarshalStrict(data, &req); err != nil {
		return nil, fmt.Errorf("%w: it does not decode strictly as %s %s (unknown or duplicate field, or wrong type)", ErrInvalidRequest, tm.APIVersion, RequestKind)
	}
	if err := ValidateRequest(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// ValidateRequest checks what every request has: a known call, an image,
// and a digest or an image ID to decide on.
func ValidateRequest(req *ImagePolicyRequest) error {
	switch req.Call {
	case CallPullImage, CallCreateContainer, CallImageVolume:
	default:
		return fmt.Errorf("%w: call is %q, want one of %s", ErrInvalidRequest, clip(string(req.Call)), strings.Join(Calls(), ", "))
	}
	if req.Image == "" {
		return fmt.Errorf("%w: image is missing", ErrInvalidRequest)
	}
	if req.Digest == "" && req.ImageID == "" {
		return fmt.Errorf("%w: neither digest nor imageID is set: nothing identifies the content", ErrInvalidRequest)
	}
	return nil
}

// EncodeResponse encodes resp in apiVersion (the request's), filling
// apiVersion and kind: the plugin's side. It refuses what the proxy would.
func EncodeResponse(apiVersion string, resp ImagePolicyResponse) ([]byte, error) {
	resp.APIVersion, resp.Kind = apiVersion, ResponseKind
	b, err := json.Marshal(resp)
	if err != nil {
		return nil, err
	}
	if _, err := DecodeResponse(apiVersion, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Allow and Deny build responses.
func Allow(reason string) ImagePolicyResponse {
	t := true
	return ImagePolicyResponse{Allowed: &t, Reason: reason}
}

// Deny builds a refusal with a reason for the operator and one for the pod.
func Deny(reason, podReason string) ImagePolicyResponse {
	f := false
	return ImagePolicyResponse{Allowed: &f, Reason: reason, PodReason: podReason}
}

// unmarshalStrict decodes data into v refusing unknown, duplicate and
// case-mismatched fields (sigs.k8s.io/json, as Kubernetes does).
func unmarshalStrict(data []byte, v any) error {
	strictErrs, err := kjson.UnmarshalStrict(data, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// checkText bounds a reason: valid UTF-8, at most max bytes, no control
// character (newlines and tabs only where multiline).
func checkText(name, s string, max int, multiline bool) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes, at most %d", name, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", name)
	}
	if strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) && !(multiline && (r == '\n' || r == '\t')) }) {
		return fmt.Errorf("%s holds a control character", name)
	}
	return nil
}

// clip keeps a quoted value short: apiVersion and kind are the only parts
// of a plugin's output an error quotes, and they may be anything.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
