//go:build !linux || evloop_portable

package evloop

import (
	"net"
	"sync"
	"syscall"
)

// Poller names how loops learn of their connections' bytes.
const Poller = "portable"

// Loop is one event loop: a goroutine that runs, in the order they came,
// the tasks given to Execute and the outcomes of its connections' reads
// and writes, which their own goroutines hand it. Only Execute and Enroll
// may be called from other goroutines.
type Loop struct {
	loopBase
	bufs sync.Pool // read buffers of ReadBuffer bytes (*[]byte)

	conns map[*Conn]struct{}
	wake  chan struct{}
}

func newLoop(cfg *Config, h Handler) (*Loop, error) {
	l := &Loop{
		loopBase: newLoopBase(cfg, h),
		conns:    make(map[*Conn]struct{}),
		wake:     make(chan struct{}, 1),
	}
	size := cfg.ReadBuffer
	l.bufs.New = func() any { b := make([]byte, size); return &b }
	return l, nil
}

// post queues the outcome of a connection's read or write. Once the loop
// stops it is dropped with the queue.
func (l *Loop) post(f func()) {
	l.mu.Lock()
	l.tasks = append(l.tasks, f)
	l.signal()
	l.mu.Unlock()
}

// signal has the loop take what is queued. It runs under mu.
func (l *Loop) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// stop has the loop run what it was given and stop.
func (l *Loop) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = true
	l.signal()
}

// enroll makes nc a Conn and opens it on the loop; nc is closed if it
// fails.
func (l *Loop) enroll(nc net.Conn, ctx any) (_ *Conn, err error) {
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		if err := tc.SetNoDelay(l.noDelay); err != nil {
			return nil, err
		}
	}
	c := &Conn{loop: l, nc: nc, ctx: ctx, remote: nc.RemoteAddr()}
	if sc, ok := nc.(syscall.Conn); ok {
		rc, err := sc.SyscallConn()
		if err != nil {
			return nil, err
		}
		c.rc = rc
	}
	if err := l.runAndWait(func() error { l.open(c); return nil }); err != nil {
		return nil, err
	}
	return c, nil
}

// open starts c's reader and writer and tells the handler.
func (l *Loop) open(c *Conn) {
	l.conns[c] = struct{}{}
	c.next = make(chan struct{}, 1)
	c.wch = make(chan []byte, 2)
	go c.reader()
	go c.writer()
	if l.h.OnOpen(c) == Close {
		c.close(nil)
		return
	}
	c.armRead()
}

// run runs what comes until the loop stops. Everything queued by the time
// it looks is one round, as everything one epoll_wait returns is: the
// PollEnder is told after each.
func (l *Loop) run() {
	defer close(l.done)
	for range l.wake {
		n, stop := l.runTasks()
		if stop {
			break
		}
		if n == 0 {
			continue // a signal that came after its round was taken
		}
		if l.pollEnd != nil {
			l.pollEnd.OnPollEnd(l)
		}
	}
	l.dropTasks()
	for c := range l.conns {
		c.close(nil)
	}
}
