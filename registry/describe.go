package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// ConfigReport is what a Checker reads of the node's registry
// configuration, and what it makes of each registry there: for the
// operator (cri-image-proxy doctor).
type ConfigReport struct {
	// Runtime is whose configuration: "containerd" (hosts.toml) or "CRI-O"
	// (registries.conf).
	Runtime string
	// Read are the hosts directories searched, or the registries.conf
	// files read (the main file, if it exists, and the drop-ins).
	Read []string
	// CertsDir are containers' certs.d roots (CRI-O only).
	CertsDir []string
	// Registries are the registries configured there, and the vouched.
	Registries []RegistryReport
}

// RegistryReport is one registry as the check takes it: a hosts.toml
// directory, a [[registry]] entry, or a vouched mirror's registry.
type RegistryReport struct {
	Registry string // a host, or a [[registry]] prefix ("*.example.com", "registry.example/team")
	File     string // the file that configures it ("" for a vouched mirror alone)
	Endpoint string // where a check asks; "" when blocked, or when Problem says why none
	// Repository is a location's rewrite of the repository on the
	// registry's host: "registry.example/old → registry.example/new".
	Repository string
	Vouched    bool     // Endpoint is a mirror the operator vouched for
	Skipped    []string // endpoints never asked: mirrors, a location on another host
	Insecure   bool     // the certificate is not verified
	PlainHTTP  bool     // plain http is tried when https fails (registries.conf's insecure)
	Blocked    bool     // checks are refused
	Problem    string   // why checks of it fail before they ask (TLS files, a hosts.toml)
}

// Describe reports the configuration the next check reads.
func (c *Checker) Describe(ctx context.Context) ConfigReport {
	if c.regconf != nil {
		return c.describeRegconf()
	}
	return c.describeHosts(ctx)
}

func (c *Checker) describeRegconf() ConfigReport {
	rc := c.regconf.current()
	rep := ConfigReport{Runtime: "CRI-O", Read: rc.files, CertsDir: c.regconf.certRoots}
	vouched := *c.vouched.Load()
	seen := map[string]bool{}
	for i := range rc.registries {
		r := &rc.registries[i]
		rr := RegistryReport{Registry: r.Prefix, File: r.file, Blocked: r.Blocked}
		for _, m := range r.Mirrors {
			rr.Skipped = append(rr.Skipped, m.Location)
		}
		if strings.HasPrefix(r.Prefix, "*.") {
			rr.Endpoint = "https://<each host under " + r.Prefix[2:] + ">/v2"
			rr.Insecure, rr.PlainHTTP = r.Insecure, r.Insecure
			rep.Registries = append(rep.Registries, rr)
			continue
		}
		host := locationHost(r.Prefix)
		probe := r.Prefix
		if !strings.Contains(probe, "/") {
			probe += "/image" // a repository under the host, to rewrite
		}
		seen[host] = true
		name, err := parseImage(probe)
		probe = name.registry + "/" + name.repository // normalized: docker.io/library/image
		if err != nil {
			rr.Problem = err.Error()
		} else if v, ok := vouched[host]; ok && !r.Blocked {
			rr.Vouched, rr.Endpoint = true, v.scheme+"://"+v.host+v.path
			if ep, err := c.regconfVouched(name, probe, r, v); err != nil {
				rr.Problem = err.Error()
			} else {
				rr.Insecure = isFallback(ep.host.Client.Transport)
				rr.PlainHTTP = rr.Insecure
			}
		} else if p, err := planFor(r, host, probe); err != nil {
			rr.Problem = err.Error()
		} else if !r.Blocked {
			if p.elsewhere != "" {
				rr.Skipped = append(rr.Skipped, p.elsewhere+" (the location, on another host)")
			}
			if p.repository != "" {
				rr.Repository = r.Prefix + " → " + r.Location
			}
			rr.Insecure, rr.PlainHTTP = p.insecure, p.insecure
			rr.Endpoint = "https://" + apiHost(p.host) + "/v2"
			if _, err := c.regconf.client("https", apiHost(p.host), p.host, "/v2", p.insecure); err != nil {
				rr.Problem = err.Error()
			}
		}
		rep.Registries = append(rep.Registries, rr)
	}
	for reg, v := range vouched {
		if !seen[reg] {
			rep.Registries = append(rep.Registries, RegistryReport{Registry: reg, Endpoint: v.scheme + "://" + v.host + v.path, Vouched: true})
		}
	}
	return rep
}

// isFallback: the transport is containerd's https-then-http fallback (an
// insecure endpoint), not a plain transport.
func isFallback(rt http.RoundTripper) bool {
	_, plain := rt.(*http.Transport)
	return !plain
}

func (c *Checker) describeHosts(ctx context.Context) ConfigReport {
	rep := ConfigReport{Runtime: "containerd", Read: c.hostRoots}
	vouched := *c.vouched.Load()
	seen := map[string]bool{}
	for _, root := range c.hostRoots {
		entries, err := os.ReadDir(root)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			rep.Registries = append(rep.Registries, RegistryReport{Registry: root, Problem: err.Error()})
			continue
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			reg := e.Name()
			if h, ok := strings.CutSuffix(reg, "_"); ok && reg != "_default" {
				if i := strings.LastIndex(h, "_"); i > 0 {
					reg = h[:i] + ":" + h[i+1:] // containerd's host_port_
				}
			}
			if seen[reg] {
				continue // an earlier root's directory is the one read
			}
			seen[reg] = true
			rr := RegistryReport{Registry: reg, File: filepath.Join(root, e.Name(), "hosts.toml")}
			if _, err := os.Stat(rr.File); err != nil {
				rr.File = filepath.Join(root, e.Name()) // TLS files alone, as docker's certs.d
			}
			ep, err := c.endpointFor(ctx, reg)
			if err != nil {
				rr.Problem = err.Error()
				rep.Registries = append(rep.Registries, rr)
				continue
			}
			rr.Endpoint, rr.Vouched = ep.String(), ep.vouched
			if t, ok := ep.host.Client.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
				rr.Insecure = t.TLSClientConfig.InsecureSkipVerify
			}
			if hosts, err := c.registryHosts(ctx, reg); err == nil {
				for _, h := range hosts[:len(hosts)-1] {
					if s := h.Scheme + "://" + h.Host + h.Path; s != rr.Endpoint {
						rr.Skipped = append(rr.Skipped, s)
					}
				}
			}
			rep.Registries = append(rep.Registries, rr)
		}
	}
	for reg, v := range vouched {
		if !seen[reg] {
			rep.Registries = append(rep.Registries, RegistryReport{Registry: reg, Endpoint: v.scheme + "://" + v.host + v.path, Vouched: true})
		}
	}
	return rep
}

// String is the report of one registry, in a line.
func (r RegistryReport) String() string {
	var b strings.Builder
	b.WriteString(r.Registry)
	if r.File != "" {
		fmt.Fprintf(&b, " (%s)", r.File)
	}
	switch {
	case r.Blocked:
		b.WriteString(": blocked: checks are refused")
	case r.Endpoint != "":
		fmt.Fprintf(&b, ": asks %s", r.Endpoint)
		if r.Vouched {
			b.WriteString(" (a vouched mirror)")
		}
		if r.Insecure {
			b.WriteString(", its certificate not verified")
		}
		if r.PlainHTTP {
			b.WriteString(", then plain http")
		}
	}
	if r.Repository != "" {
		fmt.Fprintf(&b, ", repository moved: %s", r.Repository)
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(&b, "; never asked: %s", strings.Join(r.Skipped, ", "))
	}
	if r.Problem != "" {
		fmt.Fprintf(&b, "; checks fail: %s", r.Problem)
	}
	return b.String()
}
