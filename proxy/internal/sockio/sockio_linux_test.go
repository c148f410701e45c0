package sockio

import (
	"net"
	"testing"
	"time"
)

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
