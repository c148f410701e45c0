//go:build !linux || evloop_portable

package evloop

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Poller names how loops learn of their connections' bytes.
const Poller = "portable"

// Loop is one event loop: a goroutine that runs, in the order they came,
// the tasks given to Execute and the outcomes of its connections' reads
// and writes, which their own goroutines hand it. Only Execute and Enroll
// may be called from other goroutines.
type Loop struct {
	h        Handler
	pollEnd  PollEnder  // h, when it is one
	readInto ReadIntoer // h, when it is one
	readEnd  ReadEnder  // h, when it is one
	noDelay  bool
	log      *slog.Logger
	bufs     sync.Pool // read buffers of ReadBuffer bytes (*[]byte)

	conns map[*Conn]struct{}

	// count is the connections on the loop or on their way to it, which
	// Engine.Enroll balances.
	count atomic.Int32

	mu       sync.Mutex
	queue    []func() // tasks and outcomes, in the order they came
	spare    []func() // the array the loop ran from last
	stopping bool     // Execute refuses tasks
	wake     chan struct{}
	done     chan struct{}
}

func newLoop(cfg *Config, h Handler) (*Loop, error) {
	l := &Loop{
		h:       h,
		noDelay: cfg.NoDelay,
		log:     cfg.Log,
		conns:   make(map[*Conn]struct{}),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	size := cfg.ReadBuffer
	l.bufs.New = func() any { b := make([]byte, size); return &b }
	l.pollEnd, _ = h.(PollEnder)
	l.readInto, _ = h.(ReadIntoer)
	l.readEnd, _ = h.(ReadEnder)
	return l, nil
}

// Execute runs f on the loop's goroutine after what the loop is running
// now, in the order tasks were given. It fails, and f never runs, once
// the loop stops. A task may call every method of the loop's connections.
func (l *Loop) Execute(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return ErrStopped
	}
	l.queue = append(l.queue, f)
	l.signal()
	return nil
}

// post queues the outcome of a connection's read or write. Once the loop
// stops it is dropped with the queue.
func (l *Loop) post(f func()) {
	l.mu.Lock()
	l.queue = append(l.queue, f)
	l.signal()
	l.mu.Unlock()
}

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

// Enroll moves nc onto the loop and returns once the handler's OnOpen
// has run there; ctx is the connection's Context. nc is closed if it
// fails. It must not be called on a loop's goroutine.
func (l *Loop) Enroll(nc net.Conn, ctx any) (*Conn, error) {
	l.count.Add(1)
	c, err := l.enroll(nc, ctx)
	if err != nil {
		l.count.Add(-1)
		nc.Close()
	}
	return c, err
}

func (l *Loop) enroll(nc net.Conn, ctx any) (*Conn, error) {
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
	opened := make(chan struct{})
	if err := l.Execute(func() { l.open(c); close(opened) }); err != nil {
		return nil, err
	}
	select {
	case <-opened:
		return c, nil
	case <-l.done:
		select {
		case <-opened:
			return c, nil
		default:
			return nil, ErrStopped // the loop stopped without running the task
		}
	}
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
		l.mu.Lock()
		stop := l.stopping
		if len(l.queue) == 0 && !stop {
			l.mu.Unlock()
			continue // a signal that came after its round was taken
		}
		round := l.queue
		l.queue = l.spare[:0]
		l.mu.Unlock()
		for i, f := range round {
			f()
			round[i] = nil
		}
		l.spare = round[:0]
		if stop {
			break
		}
		if l.pollEnd != nil {
			l.pollEnd.OnPollEnd(l)
		}
	}
	l.mu.Lock()
	l.stopping = true
	clear(l.queue)
	l.queue = nil
	l.mu.Unlock()
	for c := range l.conns {
		c.close(nil)
	}
}
