//go:build linux && !evloop_portable

package evloop

import (
	"runtime"
	"sync/atomic"
	"time"
)

// yieldEvery is how often, at most, a loop that finds nothing to do
// yields to the Go scheduler before it blocks in epoll_wait, while
// GOMAXPROCS leaves a P to spare.
//
// Yielding every time, as a loop that never goes through the scheduler
// otherwise must now and then, costs dearly when a P is idle: each
// runtime.Gosched wakes a thread for that P (golang/go#13527), which finds
// nothing to run and sleeps again, and the loop's goroutine may move to
// it: two futex calls and two context switches each time the loop falls
// idle, thousands of times a second under load. Blocking in epoll_wait
// gives the P up anyway. Yielding now and then still has the scheduler see
// the loop pass through it, so that sysmon does not take its P away every
// 10 ms as from a goroutine that never yields.
//
// The price is paid by goroutines the loop makes runnable (a dial's, a
// TLS handshake's): they wait in the loop's P while it blocks, until the spare
// P's thread or sysmon takes them.
const yieldEvery = 5 * time.Millisecond

// polling counts the loops running in the process.
var polling atomic.Int32

// idler decides, for one loop, when it yields and how long its next
// epoll_wait may block.
type idler struct {
	last time.Time // when the loop last yielded
	// always: yield each time nothing is ready. Right while every P may
	// be running a loop: no thread is woken by a yield then, and what the
	// loop made runnable runs before it blocks. Read again at each yield
	// (runtime.GOMAXPROCS takes a lock), so a GOMAXPROCS that falls at
	// run time is seen within yieldEvery.
	always bool
}

func startIdler() *idler {
	polling.Add(1)
	return &idler{}
}

func (y *idler) stop() { polling.Add(-1) }

// afterEvents is the timeout of the wait that follows a wait that
// returned events: 0 when a yield is due, so that the loop yields before
// it blocks if nothing is ready; otherwise -1, which returns at once with
// what is ready and blocks when nothing is, sparing the system call of a
// poll that would find nothing.
func (y *idler) afterEvents() int {
	if y.always || time.Since(y.last) >= yieldEvery {
		return 0
	}
	return -1
}

// beforeBlocking yields when always says so, and otherwise at most once
// every yieldEvery.
func (y *idler) beforeBlocking() {
	now := time.Now()
	if !y.always && now.Sub(y.last) < yieldEvery {
		return
	}
	y.last = now
	y.always = runtime.GOMAXPROCS(0) <= int(polling.Load())
	runtime.Gosched()
}
