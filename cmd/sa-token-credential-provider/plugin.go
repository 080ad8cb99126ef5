package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
)

type options struct {
	audience, credentials, annotation, log string
	// podUsers maps a pod's name (from the token's claims) to the user
	// whose credentials the pod's token gets, over the annotation's: one
	// service account's pods get different credentials, as from a token
	// exchange that answers per workload, and a test can tell whose token
	// a credential was minted for.
	podUsers map[string]string
	// cacheDuration, when set, is answered as the response's cacheDuration.
	cacheDuration *time.Duration
	now           func() time.Time
}

// claims are the parts of a service account token the plugin checks.
type claims struct {
	Audience  audience `json:"aud"`
	Expires   int64    `json:"exp"`
	NotBefore int64    `json:"nbf"`
	Subject   string   `json:"sub"`
	K8s       struct {
		Namespace string `json:"namespace"`
		Pod       *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// audience is "aud", a string or a list of them.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = []string{one}
		return nil
	}
	var many []string
	err := json.Unmarshal(b, &many)
	*a = many
	return err
}

func run(in io.Reader, out io.Writer, o options) error {
	data, err := io.ReadAll(io.LimitReader(in, 1<<20))
	if err != nil {
		return err
	}
	req, version, err := pluginapi.DecodeRequest(data)
	if err != nil {
		return err
	}
	if version != credentialproviderv1.SchemeGroupVersion {
		// Service-account tokens exist in v1 only.
		return fmt.Errorf("want a %s CredentialProviderRequest, got %s", credentialproviderv1.SchemeGroupVersion, version)
	}
	c, err := checkToken(req.ServiceAccountToken, o)
	if err != nil {
		return err
	}
	user := req.ServiceAccountAnnotations[o.annotation]
	if user == "" {
		return fmt.Errorf("service account %s/%s: no annotation %s", c.K8s.Namespace, c.K8s.ServiceAccount.Name, o.annotation)
	}
	if u, ok := o.podUsers[c.K8s.Pod.Name]; ok {
		user = u
	}
	pass, err := password(o.credentials, user)
	if err != nil {
		return err
	}
	if o.log != "" {
		if err := logClaims(o.log, req, c, o.now()); err != nil {
			return err
		}
	}
	registry, _, _ := strings.Cut(req.Image, "/")
	resp := &credentialproviderapi.CredentialProviderResponse{
		CacheKeyType: credentialproviderapi.RegistryPluginCacheKeyType,
		Auth:         map[string]credentialproviderapi.AuthConfig{registry: {Username: user, Password: pass}},
	}
	if o.cacheDuration != nil {
		resp.CacheDuration = &metav1.Duration{Duration: *o.cacheDuration}
	}
	b, err := pluginapi.EncodeResponse(version, resp)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

// checkToken decodes the token's claims (without checking the signature)
// and checks audience, time and pod binding.
func checkToken(token string, o options) (*claims, error) {
	if token == "" {
		return nil, errors.New("no service account token in the request")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("the token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, errors.New("the token's payload is not base64url")
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, errors.New("the token's payload is not JSON claims")
	}
	now := o.now().Unix()
	switch {
	case !slices.Contains(c.Audience, o.audience):
		return nil, fmt.Errorf("the token's audience is %v, want %q", []string(c.Audience), o.audience)
	case c.Expires <= now:
		return nil, fmt.Errorf("the token expired %ds ago", now-c.Expires)
	case c.NotBefore > now+60:
		return nil, errors.New("the token is not valid yet")
	case c.K8s.Pod == nil || c.K8s.Pod.Name == "" || c.K8s.Pod.UID == "":
		return nil, errors.New("the token is not bound to a pod")
	}
	return &c, nil
}

func password(file, user string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if u, p, ok := strings.Cut(sc.Text(), ":"); ok && u == user {
			return p, nil
		}
	}
	return "", fmt.Errorf("no user %q in %s", user, file)
}

// logClaims appends what the plugin saw: claims, never the token.
func logClaims(path string, req *credentialproviderapi.CredentialProviderRequest, c *claims, now time.Time) error {
	line, _ := json.Marshal(map[string]any{
		"image": req.Image, "audience": []string(c.Audience), "expiresInSeconds": c.Expires - now.Unix(),
		"namespace": c.K8s.Namespace, "serviceAccount": c.K8s.ServiceAccount.Name, "serviceAccountUID": c.K8s.ServiceAccount.UID,
		"pod": c.K8s.Pod.Name, "podUID": c.K8s.Pod.UID, "annotations": req.ServiceAccountAnnotations,
	})
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(append(line, '\n'))
	return err
}
