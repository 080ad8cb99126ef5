package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: oomclamp RUNTIME [ARGS...]")
		os.Exit(2)
	}
	runtime, args := os.Args[1], os.Args[2:]
	if floor, err := ownOOMScoreAdj(); err == nil {
		for _, f := range specFiles(args) {
			if err := clampFile(f, floor); err != nil {
				// The runtime reads the file next and says what is wrong
				// with it better than we can; only note it.
				fmt.Fprintf(os.Stderr, "oomclamp: %s: %v\n", f, err)
			}
		}
	}
	err := syscall.Exec(runtime, append([]string{runtime}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "oomclamp: exec %s: %v\n", runtime, err)
	os.Exit(127)
}

// ownOOMScoreAdj is the value this process runs with: the lowest any child
// may set without CAP_SYS_RESOURCE.
func ownOOMScoreAdj() (int, error) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
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

// clampFile raises the oomScoreAdj of the OCI spec (config.json) or
// process (exec's process.json) at path to floor when it is lower, and
// leaves the file untouched otherwise.
func clampFile(path string, floor int) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, changed, err := clamp(data, floor)
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
func clamp(data []byte, floor int) ([]byte, bool, error) {
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
	n, ok := proc["oomScoreAdj"].(json.Number)
	if !ok {
		return data, false, nil
	}
	v, err := n.Int64()
	if err != nil || v >= int64(floor) {
		return data, false, err
	}
	proc["oomScoreAdj"] = json.Number(strconv.Itoa(floor))
	out, err := json.Marshal(doc)
	return out, true, err
}
