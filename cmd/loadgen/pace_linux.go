package main

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// preparePacing gives the pacing goroutine a thread of its own whose
// sleeps end within microseconds of when they are asked to: timer slack
// 1 ns instead of the kernel's 50 us. The thread is not handed back: it
// ends with the goroutine, slack and all.
func preparePacing() {
	runtime.LockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
}

// sleepPrecisely sleeps for d in a system call, which ends on time where
// a Go timer may fire up to a millisecond late.
func sleepPrecisely(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Nanosleep(&ts, nil)
}
