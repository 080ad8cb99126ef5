package rig

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// registryConfig is the distribution registry's configuration: one storage
// directory shared by the authenticated and the anonymous instance, so an
// image pushed once can be pulled either way. level is the log level.
func registryConfig(storage, addr, htpasswd, level string) string {
	c := fmt.Sprintf(`version: 0.1
log:
  level: %s
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: %s
  secret: rig-not-secret
  headers:
    X-Content-Type-Options: [nosniff]
health:
  storagedriver:
    enabled: false
`, level, storage, addr)
	if htpasswd != "" {
		c += fmt.Sprintf("auth:\n  htpasswd:\n    realm: rig-registry\n    path: %s\n", htpasswd)
	}
	return c
}

// writeHtpasswd writes a bcrypt htpasswd file with one user per entry.
func writeHtpasswd(path string, users map[string]string) error {
	var b strings.Builder
	for u, p := range users {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s:%s\n", u, h)
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// startRegistry starts one registry on addr and waits until it answers
// /v2/ with wantCode (401 with authentication, 200 without). level is its
// log level.
func startRegistry(dir, name, addr, storage, htpasswd, level string, wantCode int) (*Proc, error) {
	cfg := filepath.Join(dir, name+".yml")
	if err := os.WriteFile(cfg, []byte(registryConfig(storage, addr, htpasswd, level)), 0o644); err != nil {
		return nil, err
	}
	p, err := StartProc(name, filepath.Join(dir, name+".log"), nil, "docker-registry", "serve", cfg)
	if err != nil {
		return nil, err
	}
	err = WaitFor("registry "+name, p, 30e9, func() error {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != wantCode {
			return fmt.Errorf("GET /v2/: %d, want %d", resp.StatusCode, wantCode)
		}
		return nil
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// RegistryRequest is one line of a registry's access log. (The registry's
// log names the user only for failed requests, so it is not kept.)
type RegistryRequest struct {
	Method string
	Path   string
	Status int
}

// accessLine matches the combined-log-format lines the registry writes for
// every request, 401s included: `127.0.0.1 - - [date] "HEAD /v2/... HTTP/1.1" 200 ...`.
var accessLine = regexp.MustCompile(`^\S+ \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) `)

// readAccessLog parses the access lines of a registry log.
func readAccessLog(path string) ([]RegistryRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []RegistryRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := accessLine.FindStringSubmatch(sc.Text()); m != nil {
			code, _ := strconv.Atoi(m[3])
			out = append(out, RegistryRequest{Method: m[1], Path: m[2], Status: code})
		}
	}
	return out, sc.Err()
}

// UserRequest is a request the authenticated registry answered after
// authenticating its caller, and the user it authenticated.
type UserRequest struct {
	RegistryRequest
	User string
}

// logField matches one key=value field of the registry's (logrus) log
// lines; a value is bare or a quoted Go string.
var logField = regexp.MustCompile(`([A-Za-z0-9_.]+)=("(?:[^"\\]|\\.)*"|\S*)`)

// readUserLog reads the requests a registry logging at debug level
// authenticated. Its access lines do not name the user, and its other
// lines name it only at debug level (the storage driver's lines, with the
// request's ID); the request's end ("response completed") gives method,
// path and status under the same ID.
func readUserLog(path string) ([]UserRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	byID := map[string]*UserRequest{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := map[string]string{}
		for _, m := range logField.FindAllStringSubmatch(sc.Text(), -1) {
			v := m[2]
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
			fields[m[1]] = v
		}
		id := fields["http.request.id"]
		if id == "" {
			continue
		}
		r := byID[id]
		if r == nil {
			r = &UserRequest{}
			byID[id] = r
			order = append(order, id)
		}
		if u := fields["auth.user.name"]; u != "" {
			r.User = u
		}
		if st := fields["http.response.status"]; st != "" {
			r.Method, r.Path = fields["http.request.method"], fields["http.request.uri"]
			r.Status, _ = strconv.Atoi(st)
		}
	}
	var out []UserRequest
	for _, id := range order {
		if r := byID[id]; r.User != "" && r.Status != 0 {
			out = append(out, *r)
		}
	}
	return out, sc.Err()
}
