package rig

import (
	"fmt"
	"os"
	"syscall"
)

// WrapPlugin writes at path a credential or policy plugin that notes each
// run (a line "run") in countFile and then runs target with its arguments
// and input: a real plugin whose runs a test or the bench can count.
// countFile stands in the script in double quotes, so a variable of the
// plugin's environment ("$COUNT_FILE") names one too.
//
// It holds syscall.ForkLock while the file is open for writing, as os/exec
// takes it to fork: no child started meanwhile inherits the descriptor, so
// running the plugin never fails with "text file busy".
func WrapPlugin(path, target, countFile string) error {
	script := fmt.Sprintf("#!/bin/sh\necho run >> \"%s\"\nexec %s \"$@\"\n", countFile, target)
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	return os.WriteFile(path, []byte(script), 0o755)
}
