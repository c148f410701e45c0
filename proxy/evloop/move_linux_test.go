//go:build linux && !evloop_portable

package evloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// TestMovedConnectionIsHandledByItsNewLoopOnly moves a connection between
// two loops after each echo: every line comes back once and in order, each
// read by the loop the connection was moved to, and OnOpen ran on it.
func TestMovedConnectionIsHandledByItsNewLoopOnly(t *testing.T) {
	var wrong, opens atomic.Int32
	var pending atomic.Bool // a move is asked and not done
	var e *Engine
	var want atomic.Pointer[Loop] // the loop that should read next: the last to open it
	h := &handler{
		open: func(c *Conn) Action {
			opens.Add(1)
			want.Store(c.Loop())
			pending.Store(false)
			return None
		},
		traffic: func(c *Conn) Action {
			if c.Loop() != want.Load() {
				wrong.Add(1)
			}
			in := c.Peek()
			i := bytes.IndexByte(in, '\n')
			if i < 0 {
				return None
			}
			c.Write(in[:i+1])
			c.Discard(i + 1)
			// Moving inside its own callback is not allowed: a task does
			// it, after the callback. One move at a time: the next line
			// may come before it.
			if pending.Load() {
				return None
			}
			pending.Store(true)
			src := c.Loop()
			dst := e.Loops()[0]
			if dst == src {
				dst = e.Loops()[1]
			}
			src.Execute(func() {
				if err := c.MoveTo(dst); err != nil {
					// At the end the client closes, and the engine stops.
					if !errors.Is(err, ErrBusy) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, ErrStopped) {
						t.Errorf("move: %v", err)
					}
					pending.Store(false)
				}
			})
			return None
		},
	}
	e = start(t, Config{Loops: 2}, h)
	// The first loop has the fewest connections, none: it is enrolled there.
	client, _ := pair(t, e, nil, nil)
	buf := make([]byte, 64)
	for i := range 50 {
		line := []byte{'a' + byte(i%26), '\n'}
		if _, err := client.Write(line); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(client, buf[:2]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:2], line) {
			t.Fatalf("echo %d: %q, want %q", i, buf[:2], line)
		}
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d reads on a loop the connection had left", n)
	}
	if n := opens.Load(); n < 5 {
		t.Fatalf("OnOpen ran %d times: the connection hardly moved", n)
	}
	if a, b := e.Loops()[0].count.Load(), e.Loops()[1].count.Load(); a+b != 1 {
		t.Fatalf("loops count %d and %d connections, want 1 in all", a, b)
	}
}

// TestMoveRefusesABusyConnection: bytes read and not discarded keep a
// connection where it is.
func TestMoveRefusesABusyConnection(t *testing.T) {
	got := make(chan error, 1)
	var e *Engine
	h := &handler{traffic: func(c *Conn) Action {
		c.Loop().Execute(func() { got <- c.MoveTo(e.Loops()[1]) })
		return None // nothing discarded
	}}
	e = start(t, Config{Loops: 2}, h)
	client, _ := pair(t, e, nil, nil)
	client.Write([]byte("x"))
	if err := <-got; !errors.Is(err, ErrBusy) {
		t.Fatalf("MoveTo = %v, want ErrBusy", err)
	}
}
