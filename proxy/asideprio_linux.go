//go:build linux

package proxy

import "golang.org/x/sys/unix"

// How much lower than the rest of the process's the OS priority of some
// threads is: a nice value that much higher (at most 19). When the machine
// is busy the kernel runs the first loop, memcached and the clients first,
// so a light request waits less behind other clients' heavy ones. Raising
// a thread's nice value needs no privilege; lowering it again would, so a
// thread keeps it for life.
const (
	// asideNice is the workers' (see loopaside.go): they rebuild
	// postings with the time left.
	asideNice = 10
	// heavyNice is the loops' that serve only clients of long replies
	// (see loopmove.go).
	heavyNice = 19
)

// lowersPriority: the workers' threads, and the heavy loops', run at a
// lower priority than the first loop's (see lowerPriority).
const lowersPriority = true

// lowerPriority raises the nice value of the calling thread by by. On
// Linux a priority set for a thread id is that thread's alone.
func lowerPriority(by int) {
	tid := unix.Gettid()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return
	}
	nice := 20 - prio // the system call answers 20 - nice, from 1 to 40
	unix.Setpriority(unix.PRIO_PROCESS, tid, min(19, nice+by))
}
