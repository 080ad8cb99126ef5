package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU returns the CPU time used so far by process pid, all threads;
// pid 0 is this process.
func processCPU(pid int) time.Duration {
	clk := int32(unix.CLOCK_PROCESS_CPUTIME_ID)
	if pid != 0 {
		clk = int32((^pid)<<3 | 2) // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(clk, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
