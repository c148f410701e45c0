package sockio

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestRawWriterWaitsForRoomAndWritesEveryByte writes more than a socket
// buffer holds, in pieces of odd sizes, to a peer that starts reading only
// later: the writer must meet EAGAIN, wait for room, and go on where it
// stopped, inside a piece as well as between pieces.
func TestRawWriterWaitsForRoomAndWritesEveryByte(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		time.Sleep(100 * time.Millisecond) // let the sender fill the buffers
		b, _ := io.ReadAll(c)
		got <- b
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	rc := RawConnOf(nc)
	if rc == nil {
		t.Fatal("a TCP connection has no raw socket")
	}
	var want []byte
	var pieces [][]byte
	for i, n := range []int{3, 5 << 20, 1, 70001, 0, 3 << 20} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		pieces = append(pieces, p)
		want = append(want, p...)
	}
	w := NewWriter(rc)
	n, err := w.Write(pieces)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("wrote %d of %d bytes: %v", n, len(want), err)
	}
	if n, err := w.WriteOne([]byte("end")); err != nil || n != 3 {
		t.Fatalf("WriteOne wrote %d bytes: %v", n, err)
	}
	nc.Close()
	b := <-got
	if !bytes.Equal(b, append(want, "end"...)) {
		t.Fatalf("the peer read %d bytes, not the %d written in order", len(b), len(want)+3)
	}
}

// TestRawWriterHonoursTheWriteDeadline: a peer that never reads makes the
// write end at its deadline, not hang.
func TestRawWriterHonoursTheWriteDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			<-done
			c.Close()
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	start := time.Now()
	n, err := NewWriter(RawConnOf(nc)).WriteOne(make([]byte, 64<<20))
	if err == nil || n >= 64<<20 {
		t.Fatalf("wrote %d bytes to a peer that reads nothing, err %v", n, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the write ended after %v with a 200ms deadline", took)
	}
}
