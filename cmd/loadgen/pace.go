package main

import (
	"math"
	"sync/atomic"
	"time"

	"mcsidecar/proxy/evloop"
)

// An open loop (--rate) sends each request when it is due, whether or not
// the replies to earlier ones have come, and measures its latency from
// then. A closed loop waits for each reply before it sends the next
// request, so a server that stalls is simply asked less and its stall
// shows in one request's latency (coordinated omission); in an open loop
// it shows in every request the stall delays. Connection i's k-th
// request is due at start + (k*conns + i)/rate: the requests are spread
// evenly over the connections and over time.
//
// One goroutine sleeps until the next request is due and then has every
// loop send what has come due on its connections. It sleeps in a system
// call of its own thread, with the thread's timer slack cut to 1 ns (see
// pace_linux.go): Go's timers wake a goroutine up to a millisecond late
// when its thread waits in epoll, which would count as latency, and the
// kernel's default slack adds 50 us. A request that goes out more than
// lateAfter after it was due is counted late: loadgen, or the loop, fell
// behind the schedule (its latency still counts from when it was due).
// Only the event loops run an open loop: on a goroutine per connection,
// sending and reading would need a goroutine each.

const (
	// lateAfter is how far behind its schedule a request may go out
	// before it counts as late.
	lateAfter = time.Millisecond
	// minPause is the shortest sleep between two rounds of sending: at
	// high rates a round sends several requests per connection rather
	// than waking for each.
	minPause = 50 * time.Microsecond
)

// paceGroup is the connections of one loop, sent to together.
type paceGroup struct {
	loop    *evloop.Loop
	workers []*worker
	queued  atomic.Bool // a round is waiting to run on the loop
}

// pace runs the open loop's schedule until the run is over, then has
// every connection finish once its replies are in.
func (d *loopDriver) pace() {
	cfg := d.sh.cfg
	var groups []*paceGroup
	byLoop := map[*evloop.Loop]*paceGroup{}
	for _, w := range d.workers {
		if w.gc == nil {
			continue // given up during pre-population
		}
		g := byLoop[w.gc.Loop()]
		if g == nil {
			g = &paceGroup{loop: w.gc.Loop()}
			byLoop[g.loop] = g
			groups = append(groups, g)
		}
		g.workers = append(g.workers, w)
	}
	preparePacing()
	start := d.sh.start
	for {
		now := time.Now()
		over := cfg.duration > 0 && !now.Before(d.sh.end) || cfg.requests > 0 && d.sh.claimed.Load() >= cfg.requests
		for _, g := range groups {
			if !g.queued.Swap(true) {
				g.loop.Execute(func() {
					g.queued.Store(false)
					now := time.Now()
					for _, w := range g.workers {
						d.pump(w, now)
					}
				})
			}
		}
		if over {
			return
		}
		n := math.Floor(now.Sub(start).Seconds()*cfg.rate) + 1
		next := start.Add(time.Duration(n / cfg.rate * float64(time.Second)))
		if cfg.duration > 0 && next.After(d.sh.end) {
			next = d.sh.end
		}
		select {
		case <-d.stopped:
			return
		case <-d.done:
			return
		default:
			sleepPrecisely(max(time.Until(next), minPause))
		}
	}
}

// pump sends the worker's requests that are due by now, and finishes the
// worker once it is to send no more and its replies are in. It runs on
// the worker's loop.
func (d *loopDriver) pump(w *worker, now time.Time) {
	if w.finished {
		return
	}
	cfg := w.cfg
	for !w.drained {
		at := d.sh.start.Add(time.Duration(float64(w.sent*int64(cfg.conns)+int64(w.id)) / cfg.rate * float64(time.Second)))
		switch {
		case cfg.duration > 0 && !at.Before(d.sh.end),
			cfg.requests > 0 && d.sh.claimed.Load() >= cfg.requests:
			w.drained = true
			continue
		case at.After(now):
			return
		case cfg.requests > 0 && d.sh.claimed.Add(1) > cfg.requests:
			w.drained = true
			continue
		}
		if now.Sub(at) > lateAfter {
			w.late++
		}
		if err := w.send(at, now); err != nil {
			d.fail(w, err)
			w.gc.Close()
			return
		}
		w.sent++
	}
	if w.pending.n == 0 {
		d.finish(w)
	}
}
