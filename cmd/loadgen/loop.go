package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"mcsidecar/proxy/evloop"
)

// The timed phase runs on event loops by default: a goroutine per
// connection blocked in a read costs loadgen a read that finds nothing, a
// park and a wake-up on Go's poller for every reply, which made loadgen
// the biggest user of the CPU that it shares with the servers it measures.
// On a loop each reply costs one read once epoll says it has come, and the
// next request one write. The connections are dialled, and the keys
// pre-populated, on goroutines as before; TLS stays on them throughout.

// loopDriver is the event handler of the timed phase's loops.
type loopDriver struct {
	sh      *shared
	workers []*worker
	cli     *evloop.Engine
	left    atomic.Int64  // workers not finished
	done    chan struct{} // closed when left reaches 0
	stopped chan struct{} // ends the timeout watch
}

// errReplyTimeout is what a reply that took longer than --timeout fails
// its connection with.
var errReplyTimeout = errors.New("no reply within --timeout")

// startLoops hands the workers' connections to n event loops, where they
// wait for run.
func startLoops(sh *shared, workers []*worker, n int) (*loopDriver, error) {
	d := &loopDriver{sh: sh, workers: workers, done: make(chan struct{}), stopped: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("from", "loadgen")
	cli, err := evloop.New(evloop.Config{Loops: n, NoDelay: true, Log: log}, d)
	if err != nil {
		return nil, err
	}
	d.cli = cli
	for _, w := range workers {
		if w.dead {
			continue
		}
		gc, err := cli.Enroll(w.nc, w) // closes w.nc, keeping a copy of its socket
		if err != nil {
			d.stop()
			return nil, fmt.Errorf("conn %d: onto an event loop: %w", w.id, err)
		}
		w.gc, w.onLoop = gc, true
		w.wr.Reset(&w.out)
		d.left.Add(1)
	}
	return d, nil
}

// run has every connection send its first request and returns once all
// have finished.
func (d *loopDriver) run() {
	if d.left.Load() == 0 {
		return
	}
	go d.watch()
	if d.sh.cfg.rate > 0 {
		go d.pace()
		<-d.done
		return
	}
	for _, w := range d.workers {
		if gc := w.gc; gc != nil {
			gc.Loop().Execute(func() { // its OnTraffic sends the first request
				if d.OnTraffic(gc) == evloop.Close {
					gc.Close()
				}
			})
		}
	}
	<-d.done
}

// stop stops the loops, closing their connections.
func (d *loopDriver) stop() {
	close(d.stopped)
	d.cli.Stop()
}

// watch closes the connections whose reply is overdue, as the deadline
// of a blocked read would.
func (d *loopDriver) watch() {
	timeout := d.sh.cfg.timeout
	t := time.NewTicker(min(timeout/4, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-d.stopped:
			return
		case <-d.done:
			return
		case now := <-t.C:
			for _, w := range d.workers {
				sent := w.sentAt.Load()
				if sent != 0 && now.UnixNano()-sent > int64(timeout) && !w.timedOut.Swap(true) {
					gc := w.gc
					gc.Loop().Execute(gc.Close)
				}
			}
		}
	}
}

// OnOpen has nothing to do: run sends the first requests.
func (d *loopDriver) OnOpen(*evloop.Conn) evloop.Action { return evloop.None }

func (d *loopDriver) OnTraffic(c *evloop.Conn) evloop.Action {
	w := c.Context().(*worker)
	if w.finished {
		return evloop.None
	}
	open := d.sh.cfg.rate > 0
	if w.pending.n == 0 {
		if !open {
			return d.next(w) // woken by run
		}
		if c.InboundBuffered() > 0 {
			d.fail(w, fmt.Errorf("%d bytes with nothing asked: %w", c.InboundBuffered(), errFraming))
			return evloop.Close
		}
		return evloop.None
	}
	// A reply read whole in one go is read where the loop read it; one
	// that comes in pieces is gathered in w.acc, its first piece copied
	// there and the rest read into it (see ReadInto).
	in := c.Peek()
	c.Discard(len(in))
	buf := in
	if n := len(w.acc); n > 0 {
		if len(in) > 0 && n < cap(w.acc) && &w.acc[:n+1][n] == &in[0] {
			w.acc = w.acc[:n+len(in)]
		} else {
			w.acc = append(w.acc, in...)
		}
		buf = w.acc
	}
	// In an open loop several replies may have come; in a closed one the
	// reply to the one request in flight is all there may be.
	for {
		n := w.scan.end(buf)
		if n == 0 {
			// The rest of the reply is still to come: keep what there is
			// of it at the start of w.acc (where it may be already).
			if len(buf) == 0 {
				w.acc = w.acc[:0]
			} else if len(w.acc) == 0 || &buf[0] != &w.acc[0] {
				w.acc = append(w.acc[:0], buf...)
			}
			return evloop.None
		}
		r := w.pending.front()
		w.reply = buf[:n]
		var err error
		if r.setKey < 0 {
			err = w.recvGet(r)
		} else {
			err = w.recvSet(r.setKey)
		}
		if err == nil && len(w.reply) > 0 {
			err = fmt.Errorf("reply read short of its framing: %w", errFraming)
		}
		buf, w.reply = buf[n:], nil
		w.completed()
		if err == nil && w.pending.n == 0 && len(buf) > 0 {
			err = fmt.Errorf("%d bytes after the reply: %w", len(buf), errFraming)
		}
		if err != nil {
			d.fail(w, err)
			return evloop.Close
		}
		if w.pending.n == 0 {
			w.acc = w.acc[:0]
			break
		}
	}
	if open {
		if w.drained {
			d.finish(w)
		}
		return evloop.None
	}
	return d.next(w)
}

// ReadInto has the rest of a reply that came in pieces read straight
// into w.acc, where its first piece waits.
func (d *loopDriver) ReadInto(c *evloop.Conn) []byte {
	w := c.Context().(*worker)
	if len(w.acc) == 0 || c.InboundBuffered() > 0 {
		return nil
	}
	w.acc = slices.Grow(w.acc, max(w.scan.need-len(w.acc), 64<<10))
	return w.acc[len(w.acc):cap(w.acc)]
}

// next sends the worker's next request in a closed loop, or finishes it
// when the run is over.
func (d *loopDriver) next(w *worker) evloop.Action {
	cfg := w.cfg
	now := time.Now()
	if cfg.duration > 0 && !now.Before(w.sh.end) || cfg.requests > 0 && w.sh.claimed.Add(1) > cfg.requests {
		d.finish(w)
		return evloop.None
	}
	if err := w.send(now, now); err != nil {
		w.completed()
		d.fail(w, err)
		return evloop.Close
	}
	return evloop.None
}

// send sends the worker's next request, a get or a set as the mix has
// it, due at at (now, in a closed loop), and adds it to those in flight.
func (w *worker) send(at, now time.Time) error {
	first := w.pending.n == 0
	r := w.pending.push()
	if len(w.own) == 0 || w.rng.Float64() < w.cfg.getRatio {
		w.sendGet(r)
	} else {
		r.setKey = w.rng.IntN(len(w.own))
		w.sendSet(r.setKey)
	}
	w.wr.Flush() // into w.out
	r.at, r.sent = at, now.UnixNano()
	if first {
		w.scan = replyScan{get: r.setKey < 0}
		w.sentAt.Store(r.sent)
	}
	_, err := w.gc.Write(w.out.b) // the loop keeps what the socket does not take
	w.out.b = w.out.b[:0]
	return err
}

// completed counts the oldest request in flight as done, its latency
// taken from when it was sent or, in an open loop, due.
func (w *worker) completed() {
	r := w.pending.front()
	get := r.setKey < 0
	if get {
		w.gets++
	} else {
		w.sets++
	}
	w.requests++
	w.record(uint64(time.Since(r.at)), get)
	w.pending.pop()
	if w.pending.n == 0 {
		w.sentAt.Store(0)
		return
	}
	next := w.pending.front()
	w.scan = replyScan{get: next.setKey < 0}
	w.sentAt.Store(next.sent)
}

func (d *loopDriver) OnClose(c *evloop.Conn, err error) {
	w := c.Context().(*worker)
	if w.finished {
		return
	}
	if w.pending.n > 0 {
		w.completed()
	}
	switch {
	case w.timedOut.Load():
		err = errReplyTimeout
	case err == nil:
		err = io.ErrUnexpectedEOF
	}
	d.fail(w, err)
}

// fail gives the worker up, as fail does on a goroutine.
func (d *loopDriver) fail(w *worker, err error) {
	w.errors++
	w.sh.report("conn %d: %v", w.id, err)
	d.finish(w)
}

func (d *loopDriver) finish(w *worker) {
	if w.finished {
		return
	}
	w.finished = true
	w.sentAt.Store(0)
	if d.left.Add(-1) == 0 {
		close(d.done)
	}
}

// replyScan finds where the reply to the request in flight ends, over
// the calls that see more of it: a get's ends at END (or at an error
// line), a set's at its first line. A reply the worker does not expect
// ends at its first line, where the worker's reading finds it wrong.
type replyScan struct {
	get bool
	// The reply is whole up to scan, where a line begins, and cannot end
	// before it is need bytes long.
	scan, need int
}

// end returns the length of the reply that b begins with, b being all of
// the connection's bytes not yet read, once b holds the whole reply, or 0.
func (r *replyScan) end(b []byte) int {
	for r.need <= len(b) {
		i := bytes.IndexByte(b[r.scan:], '\n')
		if i < 0 {
			r.need = len(b) + 1
			return 0
		}
		line := b[r.scan : r.scan+i+1]
		next := r.scan + i + 1
		if !r.get || !bytes.HasPrefix(line, lineValue) {
			return next
		}
		_, _, n, ok := parseValueLine(line)
		if !ok {
			return next
		}
		r.scan = next + n + 2
		r.need = r.scan + len(lineEnd)
	}
	return 0
}

// outBuf collects a request on its way to the loop.
type outBuf struct{ b []byte }

func (o *outBuf) Write(p []byte) (int, error) {
	o.b = append(o.b, p...)
	return len(p), nil
}
