package codec

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time the calling thread has used. Benchmarks
// lock their goroutine to its thread and report throughput per CPU second
// besides MB/s: on a machine shared with other jobs, wall time counts the
// time the thread waited for a core, CPU time does not.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
