package sockio

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWrittenCountsWhatEitherDescriptorWrote checks Written against the
// bytes written, while the peer has read none of them, after it read them
// all (the acknowledged bytes moved out of the queue), and after a write
// through a duplicate of the descriptor.
func TestWrittenCountsWhatEitherDescriptorWrote(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The peer's small window keeps most bytes in the sender's queue.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	peer, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetWriteBuffer(1 << 20)
	f, err := c.(*net.TCPConn).File() // a duplicate descriptor
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	at := func() uint64 {
		t.Helper()
		n, err := Written(fd)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	w0 := at()
	for _, size := range []int{1, 4093, 45906} {
		if _, err := c.Write(bytes.Repeat([]byte{'x'}, size)); err != nil {
			t.Fatal(err)
		}
	}
	if got := at() - w0; got != 50000 {
		t.Fatalf("unread by the peer: Written moved by %d, want 50000", got)
	}
	if q, _ := unix.IoctlGetInt(fd, unix.SIOCOUTQ); q < 20000 {
		t.Fatalf("only %d bytes queued: the test does not reach the queue", q)
	}
	if _, err := io.ReadFull(peer, make([]byte, 50000)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the acknowledgements
	if got := at() - w0; got != 50000 {
		t.Fatalf("read by the peer: Written moved by %d, want 50000", got)
	}
	if _, err := f.Write(make([]byte, 1234)); err != nil {
		t.Fatal(err)
	}
	if got := at() - w0; got != 51234 {
		t.Fatalf("after a write through the duplicate: Written moved by %d, want 51234", got)
	}
}
