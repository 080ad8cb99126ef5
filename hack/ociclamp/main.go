package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ociclamp RUNTIME [ARGS...]")
		os.Exit(2)
	}
	runtime, args := os.Args[1], os.Args[2:]
	if lim, err := ownLimits(); err == nil {
		for _, f := range specFiles(args) {
			if err := clampFile(f, lim); err != nil {
				// The runtime reads the file next and says what is wrong
				// with it better than we can; only note it.
				fmt.Fprintf(os.Stderr, "ociclamp: %s: %v\n", f, err)
			}
		}
	} else {
		fmt.Fprintf(os.Stderr, "ociclamp: %v\n", err)
	}
	err := syscall.Exec(runtime, append([]string{runtime}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "ociclamp: exec %s: %v\n", runtime, err)
	os.Exit(127)
}

// limits is what the caller holds, and so what a process it starts can be
// given.
type limits struct {
	// oomScoreAdj is the caller's own: the lowest any child may set
	// without CAP_SYS_RESOURCE.
	oomScoreAdj int
	// bounding is the caller's capability bounding set, by name
	// (CAP_CHOWN, ...).
	bounding map[string]bool
	// hugetlb is whether the hugetlb cgroup controller is mounted: a
	// runtime can set hugepage limits only then.
	hugetlb bool
}

func ownLimits() (limits, error) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return limits{}, err
	}
	adj, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return limits{}, err
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return limits{}, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return limits{}, fmt.Errorf("CapBnd %q: %v", v, err)
			}
			mounts, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				return limits{}, err
			}
			return limits{oomScoreAdj: adj, bounding: capSet(mask), hugetlb: hugetlbMounted(string(mounts))}, nil
		}
	}
	return limits{}, fmt.Errorf("no CapBnd in /proc/self/status")
}

// hugetlbMounted reports whether mountinfo shows the hugetlb controller
// where runc sets limits: a cgroup v1 hierarchy with it among its options,
// or, on a cgroup v2 host (cgroup2 at /sys/fs/cgroup), in
// cgroup.controllers. The cgroup2 mount of a hybrid host
// (/sys/fs/cgroup/unified) lists the controllers no v1 hierarchy holds,
// hugetlb on these VMs, but runc sets no limit there.
func hugetlbMounted(mountinfo string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		// ... mount point ... - fstype source super-options
		pre, post, ok := strings.Cut(line, " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(after) < 3 {
			continue
		}
		switch after[0] {
		case "cgroup":
			for _, o := range strings.Split(after[2], ",") {
				if o == "hugetlb" {
					return true
				}
			}
		case "cgroup2":
			if fields[4] != "/sys/fs/cgroup" {
				continue
			}
			if c, err := os.ReadFile(fields[4] + "/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(c)), "hugetlb") {
				return true
			}
		}
	}
	return false
}

// capNames are the Linux capabilities by number, as OCI names them.
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// capSet is the set of capabilities a CapBnd-style mask holds. A
// capability newer than this table is not in it, so a request for it is
// dropped: asking less than the caller holds always applies.
func capSet(mask uint64) map[string]bool {
	set := map[string]bool{}
	for i, name := range capNames {
		if mask&(1<<uint(i)) != 0 {
			set[name] = true
		}
	}
	return set
}

// globalWithValue are the global options of runc and crun that take a
// value as the next argument: what follows them is not the command.
var globalWithValue = map[string]bool{
	"--root": true, "--log": true, "--log-format": true, "--log-level": true,
	"--criu": true, "--rootless": true, "--cgroup-manager": true,
}

// specFiles returns the OCI files the runtime will read a process from:
// the bundle's config.json for create and run (--bundle, or the working
// directory), and the --process file of exec.
func specFiles(args []string) []string {
	var bundle, process, command string
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case a == "--bundle" || a == "-b":
			bundle = next()
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		case a == "--process" || a == "-p":
			process = next()
		case strings.HasPrefix(a, "--process="):
			process = strings.TrimPrefix(a, "--process=")
		case command == "" && globalWithValue[a]:
			next()
		case command == "" && !strings.HasPrefix(a, "-"):
			command = a
		}
	}
	switch command {
	case "create", "run":
		if bundle == "" {
			bundle = "."
		}
		return []string{bundle + "/config.json"}
	case "exec":
		if process != "" {
			return []string{process}
		}
	}
	return nil
}

// clampFile clamps the process of the OCI spec (config.json) or exec's
// process file at path to lim, and leaves the file untouched when nothing
// asks for more.
func clampFile(path string, lim limits) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, changed, err := clamp(data, lim)
	if err != nil || !changed {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, st.Mode().Perm())
}

// clamp does clampFile's work on the file's content. A config.json holds
// the process under "process"; exec's process file is the process itself.
// Numbers are kept as written (json.Number), so nothing else changes.
func clamp(data []byte, lim limits) ([]byte, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, false, err
	}
	proc := doc
	if p, ok := doc["process"].(map[string]any); ok {
		proc = p
	}
	changed := false
	if n, ok := proc["oomScoreAdj"].(json.Number); ok {
		v, err := n.Int64()
		if err != nil {
			return nil, false, err
		}
		if v < int64(lim.oomScoreAdj) {
			proc["oomScoreAdj"] = json.Number(strconv.Itoa(lim.oomScoreAdj))
			changed = true
		}
	}
	// Without the controller, runc fails a container with hugepage limits
	// ("cannot set hugetlb limit"), and the kubelet gives every container
	// some; containerd drops them then (tolerate_missing_hugetlb_controller),
	// CRI-O does not. Only a bundle's config.json has them.
	if linux, ok := doc["linux"].(map[string]any); ok && !lim.hugetlb {
		if res, ok := linux["resources"].(map[string]any); ok {
			if _, ok := res["hugepageLimits"]; ok {
				delete(res, "hugepageLimits")
				changed = true
			}
		}
	}
	if caps, ok := proc["capabilities"].(map[string]any); ok {
		for set, list := range caps {
			names, ok := list.([]any)
			if !ok {
				continue
			}
			kept := make([]any, 0, len(names))
			for _, n := range names {
				if name, ok := n.(string); ok && !lim.bounding[name] {
					changed = true
					continue
				}
				kept = append(kept, n)
			}
			caps[set] = kept
		}
	}
	if !changed {
		return data, false, nil
	}
	out, err := json.Marshal(doc)
	return out, true, err
}
