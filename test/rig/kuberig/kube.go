package kuberig

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version hack/build-k8s.sh builds.
const KubeVersion = "v1.37.1"

// Kube is a real etcd and kube-apiserver on 127.0.0.1 (Node,RBAC
// authorization, NodeRestriction admission), started from the binaries
// hack/build-k8s.sh made.
type Kube struct {
	Dir    string
	Server string // https://127.0.0.1:port
	CA     []byte // the apiserver's self-signed certificate
	// Tokens are the static bearer tokens, by user name.
	Tokens map[string]string
	// Admin is a client in system:masters, AdminConfig its configuration.
	Admin       *kubernetes.Clientset
	AdminConfig *rest.Config

	etcd, apiserver *rig.Proc
	auditLog        string
}

// AuditEvent is what the tests read of an audit.k8s.io/v1 Event.
type AuditEvent struct {
	Verb string `json:"verb"`
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// AuditEvents reads the apiserver's audit log (every request so far, at
// Metadata level).
func (k *Kube) AuditEvents() ([]AuditEvent, error) {
	if k.auditLog == "" {
		return nil, errors.New("the apiserver writes no audit log: start it with Options.Audit")
	}
	data, err := os.ReadFile(k.auditLog)
	if err != nil {
		return nil, err
	}
	var out []AuditEvent
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e AuditEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			continue // a line being written
		}
		out = append(out, e)
	}
	return out, nil
}

// User is a user of the static token file.
type User struct {
	Name   string
	Groups []string
}

// BinDir is where hack/build-k8s.sh puts kube-apiserver and etcd.
func BinDir(r *rig.Rig) string { return filepath.Join(r.ToolsDir, "k8s-"+KubeVersion) }

// Options are what Start starts the control plane with.
type Options struct {
	// Users get static tokens (Kube.Tokens), beside an admin.
	Users []User
	// Audit makes the apiserver write an audit log of every request
	// (Kube.AuditEvents). Off for benchmarks: it costs the apiserver.
	Audit bool
}

// Start starts etcd and kube-apiserver in a directory of r with an admin
// user and opts.Users, and waits until the API is ready.
func Start(r *rig.Rig, opts Options) (k *Kube, err error) {
	users := opts.Users
	bin := BinDir(r)
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s not in %s: run hack/build-k8s.sh (hack/install-deps.sh does)", b, bin)
		}
	}
	k = &Kube{Dir: filepath.Join(r.Dir, "kube"), Tokens: map[string]string{}}
	defer func() {
		if err != nil {
			k.Stop()
		}
	}()
	if err := os.MkdirAll(filepath.Join(k.Dir, "certs"), 0o700); err != nil {
		return nil, err
	}
	etcdPort, err := rig.FreePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := rig.FreePort()
	if err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	k.etcd, err = rig.StartProc("etcd", filepath.Join(k.Dir, "etcd.log"), nil, filepath.Join(bin, "etcd"),
		"--name", "rig", "--data-dir", filepath.Join(k.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "rig="+peerURL, "--unsafe-no-fsync")
	if err != nil {
		return nil, err
	}
	if err := rig.WaitFor("etcd", k.etcd, 30*time.Second, func() error { return httpOK(etcdURL+"/health", nil) }); err != nil {
		return nil, err
	}

	// The service account signing key, and the static tokens.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	saKey, saPub := filepath.Join(k.Dir, "sa.key"), filepath.Join(k.Dir, "sa.pub")
	os.WriteFile(saKey, priv, 0o600)
	os.WriteFile(saPub, pub, 0o644)
	var tokens strings.Builder
	// The admin, the rig's node (see NodeName) and the callers' users.
	users = append([]User{{Name: "admin", Groups: []string{"system:masters"}}, {Name: NodeUser, Groups: []string{"system:nodes"}}}, users...)
	for i, u := range users {
		tok := randomHex(16)
		k.Tokens[u.Name] = tok
		fmt.Fprintf(&tokens, "%s,%s,uid-%d,\"%s\"\n", tok, u.Name, i, strings.Join(u.Groups, ","))
	}
	tokenFile := filepath.Join(k.Dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		return nil, err
	}
	var audit []string
	if opts.Audit {
		// Every request at Metadata level, once it has an answer: who made
		// it (user and user agent), what it asked and the code.
		auditPolicy := filepath.Join(k.Dir, "audit-policy.yaml")
		if err := os.WriteFile(auditPolicy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"), 0o600); err != nil {
			return nil, err
		}
		k.auditLog = filepath.Join(k.Dir, "audit.log")
		audit = []string{"--audit-policy-file", auditPolicy, "--audit-log-path", k.auditLog, "--audit-log-format", "json"}
	}

	port, err := rig.FreePort()
	if err != nil {
		return nil, err
	}
	k.Server = fmt.Sprintf("https://127.0.0.1:%d", port)
	args := []string{filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(k.Dir, "certs"),
		"--token-auth-file", tokenFile,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--service-cluster-ip-range", "10.96.0.0/16"}
	k.apiserver, err = rig.StartProc("kube-apiserver", filepath.Join(k.Dir, "kube-apiserver.log"), nil, append(args, audit...)...)
	if err != nil {
		return nil, err
	}
	crt := filepath.Join(k.Dir, "certs", "apiserver.crt")
	err = rig.WaitFor("kube-apiserver", k.apiserver, 120*time.Second, func() error {
		ca, err := os.ReadFile(crt)
		if err != nil {
			return err
		}
		k.CA = ca
		return httpOK(k.Server+"/readyz", map[string]string{"Authorization": "Bearer " + k.Tokens["admin"]})
	})
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*k.kubeconfig("admin", k.bearer("admin")), nil).ClientConfig()
	if err != nil {
		return nil, err
	}
	// Tests and the bench create objects in bulk: no client-side throttle.
	cfg.QPS, cfg.Burst = -1, 0
	k.AdminConfig = cfg
	if k.Admin, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return k, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// httpOK GETs url (any TLS certificate: readiness only) and wants 200.
func httpOK(url string, header map[string]string) error {
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func (k *Kube) bearer(user string) *clientcmdapi.AuthInfo {
	return &clientcmdapi.AuthInfo{Token: k.Tokens[user]}
}

func (k *Kube) kubeconfig(name string, auth *clientcmdapi.AuthInfo) *clientcmdapi.Config {
	c := clientcmdapi.NewConfig()
	c.Clusters["rig"] = &clientcmdapi.Cluster{Server: k.Server, CertificateAuthorityData: k.CA}
	c.AuthInfos[name] = auth
	c.Contexts["rig"] = &clientcmdapi.Context{Cluster: "rig", AuthInfo: name}
	c.CurrentContext = "rig"
	return c
}

// WriteKubeconfig writes a kubeconfig for user's static token and returns
// its path.
func (k *Kube) WriteKubeconfig(user string) (string, error) {
	if _, ok := k.Tokens[user]; !ok {
		return "", fmt.Errorf("no user %q", user)
	}
	path := filepath.Join(k.Dir, user+".kubeconfig")
	return path, clientcmd.WriteToFile(*k.kubeconfig(user, k.bearer(user)), path)
}

// WriteExecKubeconfig writes a kubeconfig whose user is an exec credential
// plugin (KEP-541): a script answering user's token as an ExecCredential.
func (k *Kube) WriteExecKubeconfig(user string) (string, error) {
	tok, ok := k.Tokens[user]
	if !ok {
		return "", fmt.Errorf("no user %q", user)
	}
	script := filepath.Join(k.Dir, user+"-exec-credential.sh")
	body := fmt.Sprintf("#!/bin/sh\necho run >> %s.calls\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}'\n", script, tok)
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(k.Dir, user+"-exec.kubeconfig")
	auth := &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: script, InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}}
	return path, clientcmd.WriteToFile(*k.kubeconfig(user, auth), path)
}

// APIServerPid is kube-apiserver's process ID.
func (k *Kube) APIServerPid() int { return k.apiserver.Pid() }

// Stop stops kube-apiserver, then etcd.
func (k *Kube) Stop() {
	for _, p := range []*rig.Proc{k.apiserver, k.etcd} {
		if p != nil {
			p.Stop(15 * time.Second)
		}
	}
}

// CreateRBAC creates the ClusterRoles and ClusterRoleBindings of an RBAC
// manifest as they are written (deploy/kubernetes/token-audiences.yaml,
// its audience filled in).
func (k *Kube) CreateRBAC(manifest []byte) error {
	ctx := context.Background()
	for _, doc := range strings.Split(string(manifest), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return err
		}
		var err error
		switch meta.Kind {
		case "ClusterRole":
			var o rbacv1.ClusterRole
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				_, err = k.Admin.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				_, err = k.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
			}
		default:
			err = fmt.Errorf("CreateRBAC: unexpected kind %q", meta.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
