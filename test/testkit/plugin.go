package testkit

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// WritePlugin writes script as an executable shell script (#!/bin/sh)
// named name into dir and returns its path.
//
// It holds syscall.ForkLock while the file is open for writing, as
// os/exec takes it to fork: a child another test forks meanwhile cannot
// inherit the descriptor, so running the script never fails with "text
// file busy".
func WritePlugin(t testing.TB, dir, name, script string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	syscall.ForkLock.Lock()
	err := os.WriteFile(path, []byte("#!/bin/sh\n"+script), 0o755)
	syscall.ForkLock.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	return path
}
