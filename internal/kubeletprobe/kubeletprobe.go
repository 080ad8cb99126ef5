package kubeletprobe

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// DefaultRuntimeEndpoint is the kubelet's default containerRuntimeEndpoint.
const DefaultRuntimeEndpoint = "unix:///run/containerd/containerd.sock"

// Endpoint is a CRI endpoint of the kubelet and where it was set.
type Endpoint struct {
	Value string
	// From says where: "flag --container-runtime-endpoint", "FILE
	// containerRuntimeEndpoint", "the default", or, for the image service,
	// "the runtime endpoint".
	From string
}

// Endpoints are the kubelet's runtime and image service endpoints.
type Endpoints struct {
	Runtime, Image Endpoint
	// ConfigFile is its --config, "" without one.
	ConfigFile string
}

// Process is a kubelet process as the probe reads it.
type Process struct {
	PID  int
	Args []string // its command line, argv[0] included
	// Root is its root directory, and Cwd its working directory within
	// it: relative paths of its flags are resolved against Cwd.
	Root fs.FS
	Cwd  string
}

// ErrNoKubelet is Find's error when no process is named kubelet.
var ErrNoKubelet = errors.New("no kubelet process")

// Find returns the kubelet process under the proc file system at proc
// (/proc), or ErrNoKubelet; with several, the oldest (lowest PID).
func Find(proc string) (int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(filepath.Join(proc, e.Name(), "comm")); err == nil && strings.TrimSpace(string(comm)) == "kubelet" {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return 0, ErrNoKubelet
	}
	sort.Ints(pids)
	return pids[0], nil
}

// Open reads process pid under proc.
func Open(proc string, pid int) (*Process, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return nil, fmt.Errorf("kubelet pid %d: %w", pid, err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	cwd, err := os.Readlink(filepath.Join(dir, "cwd"))
	if err != nil {
		cwd = "/"
	}
	return &Process{PID: pid, Args: args, Root: os.DirFS(filepath.Join(dir, "root")), Cwd: cwd}, nil
}

// kubeletFlags are the flags that decide the endpoints.
type kubeletFlags struct {
	runtime, image, config, configDir *string
}

// parseFlags reads the flags the probe needs from args (after argv[0]), in
// both of pflag's forms, --name=value and --name value; the last one wins,
// as with pflag.
func parseFlags(args []string) kubeletFlags {
	var f kubeletFlags
	targets := map[string]**string{
		"container-runtime-endpoint": &f.runtime,
		"image-service-endpoint":     &f.image,
		"config":                     &f.config,
		"config-dir":                 &f.configDir,
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		target, ok := targets[name]
		if !ok {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				continue
			}
			i++
			value = args[i]
		}
		v := value
		*target = &v
	}
	return f
}

// Endpoints resolves p's runtime and image service endpoints.
func (p *Process) Endpoints() (Endpoints, error) {
	f := parseFlags(p.Args)
	var e Endpoints
	e.Runtime = Endpoint{Value: DefaultRuntimeEndpoint, From: "the default"}
	var image *Endpoint
	apply := func(c *kubeletconfigv1beta1.KubeletConfiguration, from string) {
		if c.ContainerRuntimeEndpoint != "" {
			e.Runtime = Endpoint{Value: c.ContainerRuntimeEndpoint, From: from + " containerRuntimeEndpoint"}
		}
		if c.ImageServiceEndpoint != "" {
			image = &Endpoint{Value: c.ImageServiceEndpoint, From: from + " imageServiceEndpoint"}
		}
	}
	if f.config != nil && *f.config != "" {
		e.ConfigFile = p.abs(*f.config)
		c, err := p.readConfig(e.ConfigFile)
		if err != nil {
			return e, err
		}
		apply(c, e.ConfigFile)
	}
	if f.configDir != nil && *f.configDir != "" {
		dir := p.abs(*f.configDir)
		entries, err := fs.ReadDir(p.Root, rel(dir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return e, fmt.Errorf("kubelet --config-dir %s: %w", dir, err)
		}
		for _, d := range entries { // fs.ReadDir sorts by name, as the kubelet
			if d.IsDir() || !strings.HasSuffix(d.Name(), ".conf") {
				continue
			}
			file := path.Join(dir, d.Name())
			c, err := p.readConfig(file)
			if err != nil {
				return e, err
			}
			apply(c, file)
		}
	}
	if f.runtime != nil && *f.runtime != "" {
		e.Runtime = Endpoint{Value: *f.runtime, From: "flag --container-runtime-endpoint"}
	}
	if f.image != nil && *f.image != "" {
		image = &Endpoint{Value: *f.image, From: "flag --image-service-endpoint"}
	}
	if image != nil {
		e.Image = *image
	} else {
		e.Image = Endpoint{Value: e.Runtime.Value, From: "the runtime endpoint"}
	}
	return e, nil
}

// readConfig decodes a KubeletConfiguration file (or drop-in); fields the
// probe does not use are ignored, as a newer kubelet may have more.
func (p *Process) readConfig(file string) (*kubeletconfigv1beta1.KubeletConfiguration, error) {
	data, err := fs.ReadFile(p.Root, rel(file))
	if err != nil {
		return nil, fmt.Errorf("kubelet config %s: %w", file, err)
	}
	c := &kubeletconfigv1beta1.KubeletConfiguration{}
	if err := yaml.Unmarshal(bytes.TrimSpace(data), c); err != nil {
		return nil, fmt.Errorf("kubelet config %s: %w", file, err)
	}
	return c, nil
}

// abs resolves a path of the kubelet's flags against its working directory.
func (p *Process) abs(name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(p.Cwd, name)
}

// rel is an absolute path as an fs.FS name under the process's root.
func rel(abs string) string {
	r := strings.TrimPrefix(path.Clean(abs), "/")
	if r == "" {
		return "."
	}
	return r
}

// SocketPath is the unix socket path of a CRI endpoint (unix:///path, or
// a bare path as old kubelets accept), "" when it names no unix socket.
func SocketPath(endpoint string) string {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		return path.Clean(strings.TrimPrefix(endpoint, "unix://"))
	case strings.HasPrefix(endpoint, "/"):
		return path.Clean(endpoint)
	}
	return ""
}
