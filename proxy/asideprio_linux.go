//go:build linux

package proxy

import "golang.org/x/sys/unix"

// asideNice is how much lower than the rest of the process's the OS
// priority of the workers' threads is: a nice value that much higher (at
// most 19). When the machine is busy the kernel runs the loops, memcached
// and the clients first, and rebuilds postings with the time left, so a
// light request waits less behind other clients' heavy ones. Raising a
// thread's nice value needs no privilege.
const asideNice = 10

// lowersPriority: the workers' threads run at a lower priority than the
// loops' (see lowerPriority).
const lowersPriority = true

// lowerPriority raises the nice value of the calling thread by asideNice.
// On Linux a priority set for a thread id is that thread's alone.
func lowerPriority() {
	tid := unix.Gettid()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return
	}
	nice := 20 - prio // the system call answers 20 - nice, from 1 to 40
	unix.Setpriority(unix.PRIO_PROCESS, tid, min(19, nice+asideNice))
}
