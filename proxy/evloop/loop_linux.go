//go:build linux && !evloop_portable

package evloop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
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
	loopBase

	epfd   int
	wakefd int    // an eventfd, written to have the loop run its tasks
	buf    []byte // what reads go into unless ReadInto gives a buffer
	events []unix.EpollEvent
	byFd   []*Conn // the loop's connections, by descriptor
	iov    []unix.Iovec

	// woken: wakefd was written and the loop has not yet taken the tasks.
	woken atomic.Bool
}

func newLoop(cfg *Config, h Handler) (*Loop, error) {
	l := &Loop{
		loopBase: newLoopBase(cfg, h),
		buf:      make([]byte, cfg.ReadBuffer),
		events:   make([]unix.EpollEvent, eventsMin),
	}
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

// signal has the loop's wait return to run the tasks, unless wakefd was
// written since the loop last took them. It runs under mu.
func (l *Loop) signal() {
	if l.woken.CompareAndSwap(false, true) {
		l.wake()
	}
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

// enroll takes nc's socket and opens it on the loop; nc is closed whatever
// the outcome.
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
	if err := l.runAndWait(func() error { return l.open(c) }); err != nil {
		unix.Close(fd) // open failed, or the loop stopped without running it
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

// open puts c in the loop's epoll set and tells the handler. When it
// fails, enroll closes the socket.
func (l *Loop) open(c *Conn) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	l.keep(c)
	if l.h.OnOpen(c) == Close {
		c.close(nil)
	}
	return nil
}

// keep files c under its descriptor, where events find it.
func (l *Loop) keep(c *Conn) {
	if c.fd >= len(l.byFd) {
		l.byFd = append(l.byFd, make([]*Conn, c.fd+1-len(l.byFd))...)
	}
	l.byFd[c.fd] = c
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
		if tasks {
			// Cleared first: the tasks' own tasks write wakefd again, and
			// run after the next wait.
			l.woken.Store(false)
			if _, stop := l.runTasks(); stop {
				break
			}
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

// shutdown closes the loop's connections and its descriptors. Tasks still
// queued (a failed wait stopped the loop) are dropped: Enroll sees done.
func (l *Loop) shutdown() {
	l.dropTasks()
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
