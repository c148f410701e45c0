package sockio

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Written returns how many bytes have been written to the TCP socket fd
// in all, through any of its descriptors: those the peer acknowledged and
// those still in the send queue. Two readings differ by exactly what was
// written in between, whoever wrote it. The acknowledged count is read
// before and after the queue's length, and the pair is taken only when an
// acknowledgement did not move bytes from one to the other meanwhile.
func Written(fd int) (uint64, error) {
	if !countsAcked() {
		return 0, errors.ErrUnsupported
	}
	for range 100 {
		before, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, err
		}
		queued, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err != nil {
			return 0, err
		}
		after, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, err
		}
		if before.Bytes_acked == after.Bytes_acked {
			return after.Bytes_acked + uint64(queued), nil
		}
	}
	return 0, errors.New("sockio: acknowledgements kept moving the count of bytes written")
}

// countsAcked reports whether the kernel fills TCP_INFO's bytes
// acknowledged, which Linux does from 4.2 on; an older one leaves it 0.
var countsAcked = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 4 || major == 4 && minor >= 2
})

// Waiting reports whether bytes are waiting to be read in the socket
// under nc (under its TLS session, for a TLS connection), or in a buffer
// between the two that says how many it holds (Buffered).
func Waiting(nc net.Conn) bool {
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	if b, ok := nc.(interface{ Buffered() int }); ok && b.Buffered() > 0 {
		return true
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }) != nil || err != nil {
		return false
	}
	return n > 0
}

// Quiet reports whether the socket under nc (under its TLS session, for a
// TLS connection) is as a connection whose last reply was read and that
// nobody has written to since must be: open at both ends, with nothing to
// read. It peeks without waiting and takes nothing. A connection its peer
// closed or reset, or one holding bytes nobody asked for, is not quiet. A
// connection it cannot look at is taken to be.
func Quiet(nc net.Conn) bool {
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = t.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	quiet := true
	rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if err != unix.EINTR {
				quiet = err == unix.EAGAIN
				return
			}
		}
	})
	return quiet
}
