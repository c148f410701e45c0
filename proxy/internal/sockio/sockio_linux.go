package sockio

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

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
