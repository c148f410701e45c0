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

// TestQuietTellsAClosedOrUnexpectedConnection: a connection open at both
// ends with nothing to read is quiet, and stays so when looked at; one
// with a byte waiting is not, and the byte is still there to read; one
// the peer closed is not.
func TestQuietTellsAClosedOrUnexpectedConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if !Quiet(c) || !Quiet(c) {
		t.Fatal("an open connection with nothing to read is not quiet")
	}
	// waitFor looks until Quiet says want, as the bytes and the close
	// cross the loopback.
	waitFor := func(want bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); Quiet(c) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: Quiet still says %v", what, !want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	peer.Write([]byte{'x'})
	waitFor(false, "a byte waiting")
	b := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(b); n != 1 || b[0] != 'x' || err != nil {
		t.Fatalf("after the look, read %q, %v; want the byte waiting", b[:n], err)
	}
	waitFor(true, "the byte read")
	peer.Close()
	waitFor(false, "closed by the peer")
}
