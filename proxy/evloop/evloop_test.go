package evloop

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// stopped engine's loops must all have returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bound is how long any one wait of these tests may take.
const bound = 20 * time.Second

// handler is a Handler made of functions; those left nil do nothing.
type handler struct {
	open    func(c *Conn) Action
	traffic func(c *Conn) Action
	closed  func(c *Conn, err error)
}

func (h *handler) OnOpen(c *Conn) Action {
	if h.open != nil {
		return h.open(c)
	}
	return None
}

func (h *handler) OnTraffic(c *Conn) Action {
	if h.traffic != nil {
		return h.traffic(c)
	}
	return None
}

func (h *handler) OnClose(c *Conn, err error) {
	if h.closed != nil {
		h.closed(c, err)
	}
}

// echo writes back whatever comes.
func echo(c *Conn) Action {
	in := c.Peek()
	c.Write(in)
	c.Discard(len(in))
	return None
}

func start(t *testing.T, cfg Config, h Handler) *Engine {
	t.Helper()
	e, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// pair connects a client to a listener on 127.0.0.1 and enrolls the
// accepted side on e, after prepare (when given) has seen it.
func pair(t *testing.T, e *Engine, ctx any, prepare func(*net.TCPConn)) (net.Conn, *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(bound))
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(server.(*net.TCPConn))
	}
	c, err := e.Enroll(server, ctx)
	if err != nil {
		t.Fatal(err)
	}
	return client, c
}

// on runs f on c's loop and waits for it.
func on(t *testing.T, l *Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	if err := l.Execute(func() { f(); close(done) }); err != nil {
		t.Fatal(err)
	}
	wait(t, done)
}

func wait(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(bound):
		t.Fatal("timed out")
	}
}

func TestEchoOfMoreThanTheSocketTakesArrivesWholeAndInOrder(t *testing.T) {
	var most atomic.Int64 // the most bytes a connection held to write
	h := &handler{traffic: func(c *Conn) Action {
		echo(c)
		if n := int64(c.OutboundBuffered()); n > most.Load() {
			most.Store(n)
		}
		return None
	}}
	e := start(t, Config{Loops: 1, ReadBuffer: 4 << 10}, h)
	client, _ := pair(t, e, nil, func(s *net.TCPConn) { s.SetWriteBuffer(4 << 10) })

	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i * 7 / 5)
	}
	// The whole payload goes out before a byte is read back, so the echo
	// must hold what the socket does not take and write it on EPOLLOUT.
	sent := make(chan error, 1)
	go func() {
		_, err := client.Write(want)
		sent <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("echo differs from what was sent")
	}
	if most.Load() == 0 {
		t.Fatal("the socket took every write at once: nothing was left for EPOLLOUT")
	}
}

func TestWritevKeepsOrderAcrossBuffersTheSocketTakesInPart(t *testing.T) {
	e := start(t, Config{Loops: 1}, &handler{})
	client, c := pair(t, e, nil, func(s *net.TCPConn) { s.SetWriteBuffer(4 << 10) })
	var want []byte
	on(t, c.Loop(), func() {
		for round := range 40 {
			var bufs [][]byte
			for i := range 50 {
				b := bytes.Repeat([]byte{byte('a' + (round+i)%26)}, 1000+i)
				bufs = append(bufs, b)
				want = append(want, b...)
			}
			if i := round % 3; i == 0 {
				c.Writev(bufs)
			} else {
				for _, b := range bufs {
					c.Write(b)
				}
			}
		}
		if c.OutboundBuffered() == 0 {
			t.Error("the socket took 2 MB at once")
		}
	})
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes arrived out of order")
	}
	// The client may have read the last bytes before the loop has seen the
	// write that sent them end (with the portable poller, a writer
	// goroutine reports it): the count must come to zero, soon.
	var n int
	for deadline := time.Now().Add(bound); ; time.Sleep(time.Millisecond) {
		on(t, c.Loop(), func() { n = c.OutboundBuffered() })
		if n == 0 || time.Now().After(deadline) {
			break
		}
	}
	if n != 0 {
		t.Errorf("%d bytes still held after the client read them all", n)
	}
}

func TestTasksFromManyGoroutinesRunOnTheLoopInOrder(t *testing.T) {
	e := start(t, Config{Loops: 1}, &handler{})
	l := e.loops[0]
	const goroutines, each = 8, 500
	var seen [goroutines]int // touched only on the loop: the race detector checks
	var wg sync.WaitGroup
	var bad atomic.Int32
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			for i := range each {
				err := l.Execute(func() {
					if seen[g] != i {
						bad.Add(1)
					}
					seen[g]++
					if i == each-1 {
						close(done)
					}
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
			<-done
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	wait(t, finished)
	if bad.Load() > 0 {
		t.Fatalf("%d tasks ran out of order", bad.Load())
	}
	on(t, l, func() {
		for g, n := range seen {
			if n != each {
				t.Errorf("goroutine %d: %d tasks ran, want %d", g, n, each)
			}
		}
	})
}

// pollEndEcho echoes what a poll's events brought, written in OnPollEnd
// only, and counts the calls.
type pollEndEcho struct {
	handler
	queued   map[*Conn][]byte
	handled  int // callbacks and tasks since the last OnPollEnd
	ends     atomic.Int64
	idleEnds atomic.Int64 // OnPollEnd with nothing handled before it
}

func (p *pollEndEcho) OnPollEnd(*Loop) {
	p.ends.Add(1)
	if p.handled == 0 {
		p.idleEnds.Add(1)
	}
	p.handled = 0
	for c, b := range p.queued {
		c.Write(b)
		delete(p.queued, c)
	}
}

func TestOnPollEndRunsOnceAfterEachWaitAndWritesWhatTheEventsQueued(t *testing.T) {
	p := &pollEndEcho{queued: make(map[*Conn][]byte)}
	p.open = func(*Conn) Action { p.handled++; return None }
	p.traffic = func(c *Conn) Action {
		p.handled++
		in := c.Peek()
		p.queued[c] = append(p.queued[c], in...)
		c.Discard(len(in))
		return None
	}
	e := start(t, Config{Loops: 1}, p)
	l := e.loops[0]
	var clients []net.Conn
	for range 10 {
		client, _ := pair(t, e, nil, nil)
		clients = append(clients, client)
	}
	for round := range 50 {
		for i, client := range clients {
			fmt.Fprintf(client, "round %d client %d\n", round, i)
		}
		for i, client := range clients {
			want := fmt.Sprintf("round %d client %d\n", round, i)
			got := make([]byte, len(want))
			if _, err := io.ReadFull(client, got); err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		}
	}
	// A task given once the last one ran is the only thing its wait
	// handles, and OnPollEnd follows it before the loop waits again. The
	// portable poller may also end a round for the outcome of a write of
	// the last echo, which comes when it comes: there, at least 20.
	before := p.ends.Load()
	for range 20 {
		on(t, l, func() { p.handled++ })
	}
	on(t, l, func() {
		p.handled++
		if n := p.ends.Load() - before; n < 20 || n > 20 && Poller == "epoll" {
			t.Errorf("20 tasks, each in a wait of its own, were followed by %d OnPollEnd calls", n)
		}
	})
	// The portable poller's rounds also end writes, which the handler
	// does not see.
	if n := p.idleEnds.Load(); n > 0 && Poller == "epoll" {
		t.Fatalf("%d OnPollEnd calls followed a wait that handled nothing", n)
	}
}

// readIntoEcho reads each connection's bytes into a buffer of its own.
type readIntoEcho struct {
	handler
	bufs    map[*Conn][]byte
	inPlace atomic.Int64
	reads   atomic.Int64
}

func (r *readIntoEcho) ReadInto(c *Conn) []byte {
	if c.InboundBuffered() > 0 {
		return nil
	}
	b := r.bufs[c]
	if b == nil {
		b = make([]byte, 1000)
		r.bufs[c] = b
	}
	return b
}

func TestReadIntoPutsTheNextReadInTheHandlersBuffer(t *testing.T) {
	r := &readIntoEcho{bufs: make(map[*Conn][]byte)}
	r.traffic = func(c *Conn) Action {
		r.reads.Add(1)
		in := c.Peek()
		if b := r.bufs[c]; len(in) > 0 && b != nil && &in[0] == &b[0] {
			r.inPlace.Add(1)
			if len(in) > len(b) {
				t.Errorf("a read of %d bytes into a buffer of %d", len(in), len(b))
			}
		}
		return echo(c)
	}
	e := start(t, Config{Loops: 1}, r)
	client, _ := pair(t, e, nil, nil)
	want := bytes.Repeat([]byte("0123456789"), 1000)
	for i := 0; i < len(want); i += 500 {
		if _, err := client.Write(want[i : i+500]); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 500)
		if _, err := io.ReadFull(client, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i:i+500]) {
			t.Fatalf("at %d: got %q", i, got)
		}
	}
	if r.inPlace.Load() == 0 || r.inPlace.Load() != r.reads.Load() {
		t.Fatalf("%d of %d reads went into the handler's buffer", r.inPlace.Load(), r.reads.Load())
	}
}

func TestBytesLeftUnreadComeFirstInTheNextTraffic(t *testing.T) {
	lines := make(chan string, 100)
	h := &handler{traffic: func(c *Conn) Action {
		for {
			in := c.Peek()
			i := bytes.IndexByte(in, '\n')
			if i < 0 {
				return None // the rest of the line is still to come
			}
			lines <- string(in[:i])
			c.Discard(i + 1)
		}
	}}
	e := start(t, Config{Loops: 1}, h)
	client, _ := pair(t, e, nil, nil)
	for _, piece := range []string{"fir", "st\nsec", "ond\nthird\nfo", "u", "rth\n"} {
		if _, err := client.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // separate reads, most likely; correct either way
	}
	for _, want := range []string{"first", "second", "third", "fourth"} {
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case <-time.After(bound):
			t.Fatal("timed out")
		}
	}
}

// TestPausedConnectionIsNotReadUntilResumed pauses reading after each
// read: what the client sends next stays in the socket until the loop
// resumes, and then comes whole.
func TestPausedConnectionIsNotReadUntilResumed(t *testing.T) {
	got := make(chan string, 10)
	h := &handler{traffic: func(c *Conn) Action {
		got <- string(c.Peek())
		c.Discard(len(c.Peek()))
		c.PauseReading()
		return None
	}}
	e := start(t, Config{Loops: 1}, h)
	client, c := pair(t, e, nil, nil)
	receive := func(want string) {
		t.Helper()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("read %q, want %q", s, want)
			}
		case <-time.After(bound):
			t.Fatalf("%q never read", want)
		}
	}
	client.Write([]byte("one"))
	receive("one")
	client.Write([]byte("two"))
	select {
	case s := <-got:
		t.Fatalf("read %q while paused", s)
	case <-time.After(200 * time.Millisecond):
	}
	reading := true
	on(t, c.Loop(), func() {
		reading = c.Reading()
		c.ResumeReading()
	})
	if reading {
		t.Error("a paused connection reports that it is read")
	}
	receive("two")
}

// endHandler is a handler that is told of a peer's end (ReadEnder).
type endHandler struct {
	handler
	end func(c *Conn) Action
}

func (h *endHandler) OnReadEnd(c *Conn) Action { return h.end(c) }

// TestReadEndLeavesTheConnectionToWriteOn half-closes a client: a handler
// told of the end still writes, and the client sees the end only once the
// handler closes; a handler that answers Close at the end closes at once.
func TestReadEndLeavesTheConnectionToWriteOn(t *testing.T) {
	ended := make(chan *Conn, 1)
	h := &endHandler{
		handler: handler{traffic: func(c *Conn) Action {
			c.Discard(len(c.Peek()))
			return None
		}},
		end: func(c *Conn) Action {
			c.Write([]byte("after the end"))
			ended <- c
			return None
		},
	}
	e := start(t, Config{Loops: 1}, h)
	client, _ := pair(t, e, nil, nil)
	client.Write([]byte("request"))
	client.(*net.TCPConn).CloseWrite()
	var c *Conn
	select {
	case c = <-ended:
	case <-time.After(bound):
		t.Fatal("the end was not reported")
	}
	got := make([]byte, len("after the end"))
	client.SetDeadline(time.Now().Add(bound))
	if _, err := io.ReadFull(client, got); err != nil || string(got) != "after the end" {
		t.Fatalf("read %q (%v) after the end", got, err)
	}
	on(t, c.Loop(), func() { c.ResumeReading() }) // does nothing after the end
	client.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := client.Read(got); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("before the handler closed: read %d bytes (%v), want to wait", n, err)
	}
	on(t, c.Loop(), c.Close)
	client.SetReadDeadline(time.Now().Add(bound))
	readsEOF(t, client, "")

	h.end = func(*Conn) Action { return Close }
	client, _ = pair(t, e, nil, nil)
	client.(*net.TCPConn).CloseWrite()
	client.SetDeadline(time.Now().Add(bound))
	readsEOF(t, client, "")
}

// closeRecorder records the OnClose calls of a test.
type closeRecorder struct {
	mu     sync.Mutex
	errs   map[*Conn][]error
	closed chan *Conn
}

func newCloseRecorder() *closeRecorder {
	return &closeRecorder{errs: make(map[*Conn][]error), closed: make(chan *Conn, 100)}
}

func (r *closeRecorder) record(c *Conn, err error) {
	r.mu.Lock()
	r.errs[c] = append(r.errs[c], err)
	r.mu.Unlock()
	r.closed <- c
}

// next waits for the next connection closed and returns its errors.
func (r *closeRecorder) next(t *testing.T) (*Conn, []error) {
	t.Helper()
	select {
	case c := <-r.closed:
		r.mu.Lock()
		defer r.mu.Unlock()
		return c, r.errs[c]
	case <-time.After(bound):
		t.Fatal("no connection closed")
		return nil, nil
	}
}

// readsEOF checks that the client sees the connection end, after want.
func readsEOF(t *testing.T, client net.Conn, want string) {
	t.Helper()
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("read %q before the end, want %q", got, want)
	}
}

func TestCloseFromTheHandlerAndFromOutside(t *testing.T) {
	rec := newCloseRecorder()
	h := &handler{closed: rec.record, traffic: func(c *Conn) Action {
		in := string(c.Peek())
		c.Discard(len(in))
		switch in {
		case "return close":
			c.Write([]byte("bye"))
			return Close
		case "close now":
			c.Write([]byte("bye"))
			c.Close()
			c.Close() // again: nothing
			if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
				t.Errorf("a write after Close: %v", err)
			}
		}
		return None
	}}
	e := start(t, Config{Loops: 1}, h)

	for _, ask := range []string{"return close", "close now"} {
		t.Run(ask, func(t *testing.T) {
			client, c := pair(t, e, nil, nil)
			client.Write([]byte(ask))
			readsEOF(t, client, "bye")
			got, errs := rec.next(t)
			if got != c || len(errs) != 1 || errs[0] != nil {
				t.Fatalf("OnClose: %v", errs)
			}
		})
	}
	t.Run("from outside", func(t *testing.T) {
		client, c := pair(t, e, nil, nil)
		if err := c.Loop().Execute(c.Close); err != nil {
			t.Fatal(err)
		}
		readsEOF(t, client, "")
		got, errs := rec.next(t)
		if got != c || len(errs) != 1 || errs[0] != nil {
			t.Fatalf("OnClose: %v", errs)
		}
	})
	t.Run("by the peer", func(t *testing.T) {
		client, c := pair(t, e, nil, nil)
		client.Close()
		got, errs := rec.next(t)
		if got != c || len(errs) != 1 || !errors.Is(errs[0], io.EOF) {
			t.Fatalf("OnClose: %v", errs)
		}
	})
	t.Run("by a write that fails", func(t *testing.T) {
		client, c := pair(t, e, nil, nil)
		client.(*net.TCPConn).SetLinger(0)
		client.Close() // a reset
		var wrote error
		closedFirst := false
		for range 100 {
			on(t, c.Loop(), func() {
				if c.Closed() {
					closedFirst = true // the reset was read first
					return
				}
				_, wrote = c.Write([]byte("into a reset"))
				if wrote != nil && !c.Closed() {
					t.Error("a failed write left the connection open")
				}
			})
			if wrote != nil || closedFirst {
				break
			}
		}
		got, errs := rec.next(t)
		if got != c || len(errs) != 1 || errs[0] == nil {
			t.Fatalf("OnClose: %v", errs)
		}
	})
}

func TestWhatIsHeldToWriteGoesOutAfterOnClose(t *testing.T) {
	var flushed atomic.Int64
	h := &handler{closed: func(c *Conn, err error) {
		// OnClose sees the bytes held.
		flushed.Store(int64(c.OutboundBuffered()))
	}}
	e := start(t, Config{Loops: 1}, h)
	client, c := pair(t, e, nil, func(s *net.TCPConn) { s.SetWriteBuffer(4 << 10) })
	want := bytes.Repeat([]byte("x"), 1<<20)
	on(t, c.Loop(), func() {
		c.Write(want)
		c.Close()
	})
	if flushed.Load() == 0 {
		t.Fatal("OnClose saw nothing held: the socket took 1 MB at once")
	}
	// What the last write did not take is dropped; what arrives is a
	// prefix of what was written.
	got, _ := io.ReadAll(client)
	if !bytes.HasPrefix(want, got) || len(got) == 0 {
		t.Fatalf("read %d bytes, not a prefix of what was written", len(got))
	}
}

func TestManyConnectionsSpreadOverLoops(t *testing.T) {
	var perLoop sync.Map // *Loop -> *atomic.Int64
	h := &handler{traffic: echo, open: func(c *Conn) Action {
		n, _ := perLoop.LoadOrStore(c.Loop(), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return None
	}}
	e := start(t, Config{Loops: 3}, h)
	const conns = 150
	clients := make([]net.Conn, conns)
	for i := range clients {
		clients[i], _ = pair(t, e, nil, nil)
	}
	var wg sync.WaitGroup
	for i, client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 20 {
				msg := fmt.Sprintf("conn %d round %d;", i, round)
				if _, err := client.Write([]byte(msg)); err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(client, got); err != nil {
					t.Error(err)
					return
				}
				if string(got) != msg {
					t.Errorf("got %q, want %q", got, msg)
					return
				}
			}
		}()
	}
	wg.Wait()
	loops := 0
	perLoop.Range(func(_, n any) bool {
		loops++
		if got := n.(*atomic.Int64).Load(); got != conns/3 {
			t.Errorf("a loop has %d connections, want %d", got, conns/3)
		}
		return true
	})
	if loops != 3 {
		t.Fatalf("connections on %d loops, want 3", loops)
	}
}

func TestStopClosesConnectionsAndRefusesMore(t *testing.T) {
	rec := newCloseRecorder()
	e, err := New(Config{Loops: 2}, &handler{closed: rec.record})
	if err != nil {
		t.Fatal(err)
	}
	var clients []net.Conn
	for range 4 {
		client, _ := pair(t, e, nil, nil)
		clients = append(clients, client)
	}
	l := e.loops[0]
	ran := make(chan struct{})
	if err := l.Execute(func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	e.Stop()
	e.Stop()     // again: nothing
	wait(t, ran) // a task given before Stop runs
	for range 4 {
		_, errs := rec.next(t)
		if len(errs) != 1 || errs[0] != nil {
			t.Fatalf("OnClose at stop: %v", errs)
		}
	}
	for _, client := range clients {
		readsEOF(t, client, "")
	}
	if err := l.Execute(func() {}); !errors.Is(err, ErrStopped) {
		t.Fatalf("Execute after Stop: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Enroll(nc, nil); !errors.Is(err, ErrStopped) {
		t.Fatalf("Enroll after Stop: %v", err)
	}
	if _, err := nc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the conn given to a failed Enroll is not closed: %v", err)
	}
}

func TestContextAndUnixSockets(t *testing.T) {
	type tag struct{ name string }
	got := make(chan any, 2)
	h := &handler{open: func(c *Conn) Action {
		got <- c.Context()
		c.SetContext(tag{"changed"})
		return None
	}, traffic: func(c *Conn) Action {
		got <- c.Context()
		return echo(c)
	}}
	e := start(t, Config{Loops: 1, NoDelay: true}, h)
	path := t.TempDir() + "/s"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.SetDeadline(time.Now().Add(bound))
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Enroll(server, tag{"given"}); err != nil {
		t.Fatal(err)
	}
	client.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(client, b); err != nil || string(b) != "ping" {
		t.Fatalf("%q, %v", b, err)
	}
	if a, b := <-got, <-got; a != (tag{"given"}) || b != (tag{"changed"}) {
		t.Fatalf("contexts %v then %v", a, b)
	}
}

func TestConfigIsChecked(t *testing.T) {
	for _, cfg := range []Config{{Loops: 0}, {Loops: 1, ReadBuffer: -1}} {
		if _, err := New(cfg, &handler{}); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
