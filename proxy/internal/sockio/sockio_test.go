package sockio

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestWriteSomeTakesWhatTheSocketTakesAndKeepsTheRest writes more than a
// socket buffer holds, in pieces of odd sizes, to a peer that reads only
// later: WriteSome must stop at EAGAIN without waiting, hand back the rest
// (inside a piece as well as between pieces), and, called again as the
// peer reads, deliver every byte in order.
func TestWriteSomeTakesWhatTheSocketTakesAndKeepsTheRest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	nc.(*net.TCPConn).SetWriteBuffer(16 << 10)
	peer.(*net.TCPConn).SetReadBuffer(16 << 10)

	var want []byte
	var bufs [][]byte
	for i := range 200 {
		piece := bytes.Repeat([]byte{byte('a' + i%26)}, 7919+i*31)
		want = append(want, piece...)
		bufs = append(bufs, piece)
	}
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var iov []syscall.Iovec
	writeSome := func() (n int) {
		var werr error
		rc.Control(func(fd uintptr) { bufs, n, iov, werr = WriteSome(int(fd), bufs, iov) })
		if werr != nil {
			t.Fatal(werr)
		}
		return n
	}
	first := writeSome()
	if first == 0 || len(bufs) == 0 {
		t.Fatalf("the first call wrote %d bytes and left %d pieces: want some written and some left", first, len(bufs))
	}
	got := make(chan []byte)
	go func() {
		peer.SetReadDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(want))))
		got <- b
	}()
	total := first
	for deadline := time.Now().Add(20 * time.Second); len(bufs) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d bytes written after 20 s", total, len(want))
		}
		total += writeSome()
		time.Sleep(time.Millisecond)
	}
	if total != len(want) {
		t.Fatalf("WriteSome counted %d bytes, want %d", total, len(want))
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, not what was written (%d)", len(b), len(want))
	}
}
