//go:build linux && !evloop_portable

package evloop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	eventsMin = 128  // events one wait returns at first
	eventsMax = 1024 // and at most, once waits fill the array
	iovMax    = 1024 // the most buffers one writev takes (UIO_MAXIOV)
)

// Poller names how loops learn of their connections' bytes.
const Poller = "epoll"

// Loop is one event loop: a goroutine waiting on an epoll set, which owns
// the connections enrolled on it. Only Execute and Enroll may be called
// from other goroutines.
type Loop struct {
	h        Handler
	pollEnd  PollEnder  // h, when it is one
	readInto ReadIntoer // h, when it is one
	readEnd  ReadEnder  // h, when it is one
	noDelay  bool
	log      *slog.Logger

	epfd   int
	wakefd int    // an eventfd, written to have the loop run its tasks
	buf    []byte // what reads go into unless ReadInto gives a buffer
	events []unix.EpollEvent
	byFd   []*Conn // the loop's connections, by descriptor
	iov    []unix.Iovec

	// count is the connections on the loop or on their way to it, which
	// Engine.Enroll balances.
	count atomic.Int32
	// woken: wakefd was written and the loop has not yet taken the tasks.
	woken atomic.Bool

	mu       sync.Mutex
	tasks    []func()
	spare    []func() // the array the loop ran tasks from last
	stopping bool     // Execute refuses tasks
	done     chan struct{}
}

func newLoop(cfg *Config, h Handler) (*Loop, error) {
	l := &Loop{
		h:       h,
		noDelay: cfg.NoDelay,
		log:     cfg.Log,
		buf:     make([]byte, cfg.ReadBuffer),
		events:  make([]unix.EpollEvent, eventsMin),
		done:    make(chan struct{}),
	}
	l.pollEnd, _ = h.(PollEnder)
	l.readInto, _ = h.(ReadIntoer)
	l.readEnd, _ = h.(ReadEnder)
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if l.wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		unix.Close(l.epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	// Edge-triggered: each write makes one event, and the counter need
	// not be read back.
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(l.wakefd)}
	if err = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.wakefd, &ev); err != nil {
		unix.Close(l.wakefd)
		unix.Close(l.epfd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	return l, nil
}

// Execute runs f on the loop's goroutine after the events of the loop's
// current or next wait, in the order tasks were given. It fails, and f
// never runs, once the loop stops. A task may call every method of the
// loop's connections.
func (l *Loop) Execute(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return ErrStopped
	}
	l.tasks = append(l.tasks, f)
	if l.woken.CompareAndSwap(false, true) {
		l.wake()
	}
	return nil
}

// wake has the loop's wait return. It runs under mu, which keeps wakefd
// open meanwhile.
func (l *Loop) wake() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	for {
		_, err := unix.Write(l.wakefd, one[:])
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN: // the counter is full: empty it
			var b [8]byte
			unix.Read(l.wakefd, b[:])
			continue
		}
		return
	}
}

// stop has the loop run the tasks it was given and stop.
func (l *Loop) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopping {
		l.stopping = true
		l.woken.Store(true)
		l.wake()
	}
}

// Enroll moves nc onto the loop and returns once the handler's OnOpen
// has run there; ctx is the connection's Context. The loop takes a
// duplicate of nc's socket and nc is closed, whatever the outcome. It
// must not be called on a loop's goroutine.
func (l *Loop) Enroll(nc net.Conn, ctx any) (*Conn, error) {
	l.count.Add(1)
	c, err := l.enroll(nc, ctx)
	if err != nil {
		l.count.Add(-1)
	}
	return c, err
}

func (l *Loop) enroll(nc net.Conn, ctx any) (*Conn, error) {
	remote := nc.RemoteAddr()
	fd, err := takeSocket(nc)
	if err != nil {
		return nil, err
	}
	if _, tcp := nc.(*net.TCPConn); tcp && l.noDelay {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt", err)
		}
	}
	c := &Conn{loop: l, fd: fd, ctx: ctx, remote: remote}
	opened := make(chan error, 1)
	if err := l.Execute(func() { opened <- l.open(c) }); err != nil {
		unix.Close(fd)
		return nil, err
	}
	select {
	case err = <-opened:
	case <-l.done:
		select {
		case err = <-opened:
		default:
			unix.Close(fd) // the loop stopped without running the task
			return nil, ErrStopped
		}
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// takeSocket returns a non-blocking duplicate of nc's socket, and closes
// nc: Go's poller lets go of the socket, and the loop's epoll takes it.
func takeSocket(nc net.Conn) (int, error) {
	defer nc.Close()
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("evloop: %T has no socket", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	cerr := rc.Control(func(s uintptr) {
		fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	})
	if err = errors.Join(cerr, err); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, os.NewSyscallError("dup", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("fcntl", err)
	}
	return fd, nil
}

// open puts c in the loop's epoll set and tells the handler.
func (l *Loop) open(c *Conn) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		unix.Close(c.fd)
		c.fd = -1
		return os.NewSyscallError("epoll_ctl", err)
	}
	if c.fd >= len(l.byFd) {
		l.byFd = append(l.byFd, make([]*Conn, c.fd+1-len(l.byFd))...)
	}
	l.byFd[c.fd] = c
	if l.h.OnOpen(c) == Close {
		c.close(nil)
	}
	return nil
}

// run waits for events and handles them until the loop stops.
func (l *Loop) run() {
	defer close(l.done)
	y := startIdler()
	timeout := -1
	for {
		n, err := unix.EpollWait(l.epfd, l.events, timeout)
		if err != nil && err != unix.EINTR {
			l.log.Error("event loop: epoll_wait failed: the loop stops", "err", err)
			break
		}
		if err != nil || n == 0 {
			timeout = -1
			y.beforeBlocking()
			continue
		}
		timeout = y.afterEvents()
		tasks := false
		for _, ev := range l.events[:n] {
			fd := int(ev.Fd)
			switch {
			case fd == l.wakefd:
				tasks = true
			case fd < len(l.byFd) && l.byFd[fd] != nil:
				l.byFd[fd].event(ev.Events)
			}
			// Otherwise its connection closed since the wait returned.
		}
		if tasks && l.runTasks() {
			break
		}
		if l.pollEnd != nil {
			l.pollEnd.OnPollEnd(l)
		}
		if n == len(l.events) && n < eventsMax {
			l.events = make([]unix.EpollEvent, 2*n)
		}
	}
	y.stop()
	l.shutdown()
}

// runTasks runs the tasks queued so far and reports whether the loop is
// to stop. Tasks they queue run after the next wait.
func (l *Loop) runTasks() bool {
	l.woken.Store(false)
	l.mu.Lock()
	tasks := l.tasks
	l.tasks = l.spare[:0]
	stop := l.stopping
	l.mu.Unlock()
	for i, f := range tasks {
		f()
		tasks[i] = nil
	}
	l.spare = tasks[:0]
	return stop
}

// shutdown closes the loop's connections and its descriptors. Tasks still
// queued (a failed wait stopped the loop) are dropped: Enroll sees done.
func (l *Loop) shutdown() {
	l.mu.Lock()
	l.stopping = true
	clear(l.tasks)
	l.tasks = nil
	l.mu.Unlock()
	for _, c := range l.byFd {
		if c != nil {
			c.close(nil)
		}
	}
	l.mu.Lock()
	unix.Close(l.wakefd)
	unix.Close(l.epfd)
	l.mu.Unlock()
}

// watch sets the events epoll reports for c: readable, and writable too
// while c holds bytes to write.
func (l *Loop) watch(c *Conn, writes bool) error {
	return l.interest(c, writes, c.paused)
}

// interest sets what epoll reports of c: whether the socket can be
// written, and unless paused, whether it can be read. A hang-up or an
// error is reported either way.
func (l *Loop) interest(c *Conn, writes, paused bool) error {
	ev := unix.EpollEvent{Fd: int32(c.fd)}
	if !paused {
		ev.Events |= unix.EPOLLIN
	}
	if writes {
		ev.Events |= unix.EPOLLOUT
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	c.watchOut, c.paused = writes, paused
	return nil
}

// writev writes bufs to fd in one system call, or as many of them as one
// takes, and returns how many bytes the socket took.
func (l *Loop) writev(fd int, bufs [][]byte) (int, error) {
	iov := l.iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(iov) == iovMax {
			break
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	l.iov = iov
	if len(iov) == 0 {
		return 0, nil
	}
	defer clear(iov) // the buffers may go once written
	for {
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}
