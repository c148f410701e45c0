package proxy

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Opening the hits of a retrieval (verifying envelopes, rebuilding
// postings) is the one step of a request whose cost grows with its bytes: a
// 100-key get of raw postings lists rebuilds megabytes. Done on the loop, it
// uses one core however many there are, and every other client of the loop
// waits behind it. A retrieval with much to open is opened aside, on one of
// a few workers, and completed on its loop once opened; its client's
// replies are written in request order all the same, since a reply is
// written only once those before it are.

// asideYieldBytes is how much a worker opens between two yields to the Go
// scheduler, where the workers share the processors' Ps with the loops
// (see asideWorkers): without yielding, a loop back from epoll_wait with
// every P taken by a worker waits for one until the scheduler preempts
// it, 10 ms later, and so does every client of the loop. Opening 64 KB
// takes tens of microseconds.
const asideYieldBytes = 64 << 10

// loopOpenAsideMin is the arena bytes a retrieval's hits need at least to
// be opened aside: below it, handing the work to a worker and waking the
// loop after cost more than the work. A 100-key get of Mimir's own "dm"
// postings (about 300 KB, verified, not rebuilt) stays on the loop: aside,
// it cost 15 % more CPU a request for no more throughput. One of raw
// postings lists (about 2.3 MB rebuilt) goes aside.
const loopOpenAsideMin = 1 << 20

// openers runs the workers that open retrievals aside.
type openers struct {
	work   chan *loopSlot
	wg     sync.WaitGroup
	opened atomic.Uint64 // retrievals opened aside, for tests
}

// asideWorkers returns how many workers a proxy starts: one per processor,
// GOMAXPROCS as the first proxy of the process found it. Where the
// workers' threads run at a lower priority (see lowerPriority), it raises
// GOMAXPROCS, once, by that many: each worker has a P of its own, so that
// a worker the kernel holds back for the loops never holds the P a loop
// needs, and never needs to yield one. Setting GOMAXPROCS stops the Go
// runtime from following a change of the container's CPU limit.
var asideWorkers = sync.OnceValue(func() int {
	n := runtime.GOMAXPROCS(0)
	if lowersPriority {
		runtime.GOMAXPROCS(2 * n)
	}
	return n
})

// start starts the workers.
func (o *openers) start() {
	n := asideWorkers()
	o.work = make(chan *loopSlot, 2*n)
	o.wg.Add(n)
	for range n {
		go o.run()
	}
}

// stop has the workers end once the work given them is done. The loops
// have stopped: none gives more.
func (o *openers) stop() {
	close(o.work)
	o.wg.Wait()
}

func (o *openers) run() {
	defer o.wg.Done()
	if lowersPriority {
		// The thread is the worker's for good: the runtime ends it
		// with the worker, and runs nothing else on it.
		runtime.LockOSThread()
		lowerPriority(asideNice)
	}
	for s := range o.work {
		s.openAll(true)
		ls := s.client.ls
		// A loop that stopped meanwhile drops the slot with its client.
		ls.el.Execute(func() {
			ls.clock()
			s.complete()
		})
	}
}

// aside gives retrieval s to a worker to open, and reports whether one
// took it: when all are busy, the loop opens it itself, which slows the
// loop down as the workers are.
func (l *eventLoops) aside(s *loopSlot) bool {
	select {
	case l.openers.work <- s:
		l.openers.opened.Add(1)
		return true
	default:
		return false
	}
}
