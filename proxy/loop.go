package proxy

import (
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/upstream"
)

// The event-loop data path (--event-loop).
//
// Each event loop (proxy/evloop) owns its client connections and, per upstream
// server, one connection of its own. A request is read, sent upstream,
// answered and written on the loop's thread: it never waits in a
// goroutine, so it costs no scheduling. Requests of all the loop's clients
// to one server go out in one write each time the loop has handled what
// one poll returned, whatever batches are still in flight before them,
// and replies come back in order.
//
// The loop answers every command, each as explicit state that goes on when
// memcached answers: the retrievals, the storage commands (values
// enveloped and keys rewritten), delete, touch,
// incr and decr, the meta commands (loopmeta.go, loopmetaget.go), the
// read-modify-writes of enveloped values (loopmodify.go), flush_all, and
// what the sidecar answers itself (version, verbosity, mn, stats). With
// zones, a retrieval falls through the zones, the hits of other zones
// filling the local one, and writes keep the zones in line. The local
// tier is read first, and filled: local tier, local zone, other zones.

// loopTick is how often each loop checks its upstream deadlines, idle
// clients and a shutdown.
var loopTick = 10 * time.Millisecond // a var: a test puts it out of reach

// loopReadBuffer is how much each read of a loop takes at most (evloop's
// read buffer, one per loop; evloop's default is 64 KiB). A memcached reply
// to a 100-key get of 3 KiB values is about 300 KiB over four servers:
// with 256 KiB the loop reads it in 3.5 reads a request instead of 6.4.
const loopReadBuffer = 256 << 10

// eventLoops runs the event loops of a proxy.
type eventLoops struct {
	p    *Proxy
	cli  *evloop.Engine
	stop chan struct{}
	done chan struct{}
	// stopped is closed once the loops have stopped.
	stopped chan struct{}
	once    sync.Once
	// abandon: Shutdown's grace ran out, and the replies still owed are
	// not written.
	abandon atomic.Bool
	// openers open the hits of long retrievals aside (see loopaside.go).
	openers openers
	// outMax is --max-client-output-bytes (see output.go).
	outMax int

	mu    sync.Mutex
	loops map[*evloop.Loop]*loopState
}

// loopState is what one loop owns, with the free lists that let a steady
// stream of requests allocate little: only the loop's thread touches it.
type loopState struct {
	l       *eventLoops
	el      *evloop.Loop
	ups     map[*upstream.Server]*loopUpstream
	upList  []*loopUpstream // ups' values, which OnPollEnd flushes
	clients map[*loopClient]struct{}
	// heavy counts the clients of the loop that read long replies, which
	// other loops read too; moving, those that may move at the end of
	// the poll (see loopmove.go).
	heavy  atomic.Int32
	moving []*loopClient
	// heavyOnly: the loop is one of those that, with --event-loops -1,
	// serve heavy clients only; a client turned light leaves it.
	heavyOnly bool
	// held: the clients held back (loopClient.held), which OnPollEnd
	// resumes once evloop holds few enough of their replies; heldSpare is
	// the array the next pass fills.
	held, heldSpare []*loopClient
	slots           []*loopSlot
	reqs            []*loopReq
	// pool is where replies are read into (see loopUpstream.chunk).
	pool    chunks.Pool
	sealBuf []byte // a reply to a TLS client, before encryption
	// meta is where the next ms or md is parsed (see parseMeta).
	meta *loopMeta
	// ending are the clients that ended their side and are owed replies
	// (see readEnd).
	ending []*loopClient
	// arenas are arenas of slots that were longer than loopBufLimit,
	// kept for the next long reply (see loopArenasKept).
	arenas [][]byte
	// now is when the loop began handling the events of its current
	// poll: the clock is read at the first event of a poll (see clock),
	// not per event or per request, and OnPollEnd has the next poll read
	// it anew. A poll takes microseconds, a few milliseconds at most;
	// the upstream timeout and the latency histograms are coarser.
	now      time.Time
	nowTaken bool
	// rewrites: whether each key of the retrieval or gat being sent is
	// sent rewritten, as its one scan found (see inspectAll).
	rewrites []bool
	// tags numbers the loop's slots (loopSlot.tag).
	tags uint32
	// polls counts the polls the loop has handled (see check).
	polls uint64
	// What the loop's clients are owed (see output.go): the bytes
	// charged for replies, and those evloop held when last looked at; the
	// most at once (peak, for tests; peakSeen, the loop's copy).
	charged, out, peakSeen int
	peak                   atomic.Int64
}

// clock sets now, once per poll.
func (ls *loopState) clock() {
	if !ls.nowTaken {
		ls.now, ls.nowTaken = time.Now(), true
	}
}

// Free lists: what a finished request gives back, bounded so that a burst
// does not stay allocated.
const (
	loopFreeMax  = 1024
	loopBufLimit = 1 << 20
	loopSeenKeep = 4096 // entries of a repeat table kept with a free slot
	loopLineKeep = 1024 // bytes of a storage command's reply line kept with a free request

	// loopArenasKept arenas of at most loopArenaKeep bytes that are
	// longer than loopBufLimit are kept for long replies: a 100-key get
	// of raw postings rebuilds megabytes, and an arena allocated for each
	// would be zeroed and collected each time.
	loopArenasKept = 4
	loopArenaKeep  = 8 << 20
)

// take returns the last of a free list, or a new one.
func take[T any](free *[]*T) *T {
	n := len(*free)
	if n == 0 {
		return new(T)
	}
	x := (*free)[n-1]
	(*free)[n-1] = nil
	*free = (*free)[:n-1]
	return x
}

func (ls *loopState) slot(lc *loopClient, id int) *loopSlot {
	s := take(&ls.slots)
	ls.tags++
	s.client, s.id, s.kind, s.began, s.tag = lc, id, id, ls.now, ls.tags
	return s
}

func (ls *loopState) req(s *loopSlot) *loopReq {
	r := take(&ls.reqs)
	r.slot, r.began = s, s.began
	return r
}

func (ls *loopState) putReq(r *loopReq) {
	buf := r.buf[:0] // a storage command's reply line, a copy of its own
	if r.share != nil {
		ls.pool.Release(r.share)
		buf = nil
	}
	if cap(buf) > loopLineKeep {
		buf = nil
	}
	asked, key := r.asked[:0], r.key[:0]
	if cap(asked) > loopSeenKeep || cap(key) > loopBufLimit {
		asked, key = nil, nil // grown by a get of unusually many keys
	}
	*r = loopReq{asked: asked, buf: buf, key: key}
	if len(ls.reqs) < loopFreeMax {
		ls.reqs = append(ls.reqs, r)
	}
}

// putSlot gives back a slot whose reply is written, with its requests.
func (ls *loopState) putSlot(s *loopSlot) {
	for _, r := range s.reqs {
		ls.putReq(r)
	}
	clear(s.out)
	clear(s.owners)
	clear(s.reqs)
	seen, arena, meta, mod := s.seen, s.arena, s.meta, s.mod
	*s = loopSlot{out: s.out[:0], line: s.line[:0], keys: s.keys[:0], ends: s.ends[:0], ups: s.ups[:0], owners: s.owners[:0], reqs: s.reqs[:0]}
	if meta.small() {
		s.spareMeta = meta // for the next meta command (see takeMeta)
	}
	if mod != nil && cap(mod.data) <= loopMetaKeep {
		mod.op = rmw{} // the closures hold the connection
		s.spareMod = mod
	}
	if cap(s.owners) > loopSeenKeep || cap(s.keys) > loopBufLimit || cap(s.ups) > loopBufLimit || cap(s.out) > loopSeenKeep || cap(s.line) > loopBufLimit {
		// Grown by a get of unusually many keys: a free slot stays small.
		*s = loopSlot{}
	}
	switch {
	case cap(arena) <= loopBufLimit:
		s.arena = arena[:0]
	case cap(arena) <= loopArenaKeep && len(ls.arenas) < loopArenasKept:
		ls.arenas = append(ls.arenas, arena[:0])
	}
	if cap(seen) <= loopSeenKeep {
		s.seen = seen[:0]
	}
	if len(ls.slots) < loopFreeMax {
		ls.slots = append(ls.slots, s)
	}
}

func newEventLoops(p *Proxy) (*eventLoops, error) {
	l := &eventLoops{p: p, stop: make(chan struct{}), done: make(chan struct{}), stopped: make(chan struct{}), loops: make(map[*evloop.Loop]*loopState), outMax: p.cfg.maxClientOutput()}
	cli, err := evloop.New(evloop.Config{Loops: p.cfg.EventLoops, ReadBuffer: loopReadBuffer, NoDelay: true, Log: p.log}, l)
	if err != nil {
		return nil, err
	}
	l.cli = cli
	l.openers.start()
	if p.firstLoop && loopsMove {
		for _, el := range cli.Loops()[1:] {
			el.Execute(l.state(el).serveHeavyOnly)
		}
	}
	go l.tick()
	return l, nil
}

// tick runs each loop's checks every loopTick until close.
func (l *eventLoops) tick() {
	defer close(l.done)
	t := time.NewTicker(loopTick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		for el, ls := range l.loops {
			el.Execute(func() {
				ls.clock()
				ls.check()
			})
		}
		l.mu.Unlock()
	}
}

// close stops the loops; connections still on them are closed.
func (l *eventLoops) close() {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		l.cli.Stop()
		l.openers.stop()
		close(l.stopped)
	})
}

// enroll moves an accepted connection onto a loop.
func (l *eventLoops) enroll(c *conn) error {
	lc := &loopClient{c: c, last: time.Now()}
	c.lc = lc
	_, err := l.enrollOn(c.nc, lc)
	return err
}

// enrollOn hands nc to the loop it begins on.
func (l *eventLoops) enrollOn(nc net.Conn, lc *loopClient) (*evloop.Conn, error) {
	if l.p.firstLoop {
		return l.cli.Loops()[0].Enroll(nc, lc)
	}
	return l.cli.Enroll(nc, lc)
}

// enrollTLS makes the TLS handshake of an accepted connection, whose
// socket is raw, and then moves it onto a loop. The TLS server speaks
// through a bridge, as a loop's TLS clients do upstream (see loopTLS).
// The handshake is bounded by --idle-timeout, as a request is.
func (l *eventLoops) enrollTLS(c *conn, raw net.Conn, t *loopTLS) {
	if d := l.p.cfg.IdleTimeout; d > 0 {
		raw.SetDeadline(time.Now().Add(d))
	}
	err := t.conn.Handshake()
	raw.SetDeadline(time.Time{})
	if err == nil {
		lc := &loopClient{c: c, last: time.Now(), tls: t}
		c.lc = lc
		// The connection's socket is the one evloop closes, as for a
		// plain client: closing the TLS session from elsewhere would
		// write into the bridge. A shutdown reaches the socket under
		// wakeMu.
		c.wakeMu.Lock()
		c.nc, t.b.loop = raw, true
		c.wakeMu.Unlock()
		_, err = l.enrollOn(raw, lc)
	}
	if err != nil {
		c.logClose(err)
		raw.Close()
		l.p.untrack(c)
	}
}

func (l *eventLoops) state(el *evloop.Loop) *loopState {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.loops[el]
	if ls == nil {
		ls = &loopState{l: l, el: el, ups: make(map[*upstream.Server]*loopUpstream), clients: make(map[*loopClient]struct{})}
		l.loops[el] = ls
	}
	return ls
}

func (l *eventLoops) OnOpen(gc *evloop.Conn) evloop.Action {
	switch x := gc.Context().(type) {
	case *loopClient:
		x.gc = gc
		// Idle from when the loop has it: a loop that was busy when the
		// connection came must not take it as idle before reading it.
		x.last = time.Now()
		x.ls = l.state(gc.Loop())
		x.ls.clients[x] = struct{}{}
		if x.tls != nil {
			// Requests sent right after the handshake may be read already.
			x.ls.clock()
			return x.traffic()
		}
	case *loopDialed:
		u := x.u
		gc.SetContext(u)
		u.gc, u.tls, u.dialing = gc, x.tls, false
		u.ls.clock()
		u.flush()
	}
	return evloop.None
}

// ReadInto has memcached's replies read straight into the chunk they are
// gathered in (see loopUpstream.chunk), instead of into evloop's read buffer
// and copied from there. Not over TLS, whose records are read whole, nor
// while evloop holds bytes of a reply, which come first.
func (l *eventLoops) ReadInto(gc *evloop.Conn) []byte {
	if gc.InboundBuffered() > 0 {
		return nil
	}
	switch x := gc.Context().(type) {
	case *loopUpstream:
		if x.gc == gc && x.tls == nil {
			return x.room()
		}
	case *loopClient:
		if x.gc == gc && x.pend != nil {
			return x.pend[len(x.pend):cap(x.pend)] // no further than its end
		}
	}
	return nil
}

func (l *eventLoops) OnTraffic(gc *evloop.Conn) evloop.Action {
	switch x := gc.Context().(type) {
	case *loopClient:
		x.ls.clock()
		return x.traffic()
	case *loopUpstream:
		x.ls.clock()
		x.replies()
	}
	return evloop.None
}

// OnPollEnd writes what the loop's events queued upstream, once evloop has
// handled every event one epoll_wait returned and the tasks it ran: the
// requests of every client read then, and what answering replies queued
// (a zone's next read, a fill, the delete of a damaged item), go out in
// one write per server, and the writes that wake memcached come
// last before the loop waits, rather than one that memcached's thread
// preempts it at while events are left to handle.
//
// A write that fails closes its connection there and then, and answering
// the requests that were queued on it may queue more, on any server: the
// pass is made again until no connection was lost in it. Each connection
// is lost at most once, and a new one is dialled, so it ends.
func (l *eventLoops) OnPollEnd(el *evloop.Loop) {
	ls := l.state(el)
	if len(ls.held) > 0 {
		// A poll that only wrote a held client's replies ran no callback
		// that read the clock.
		ls.clock()
		ls.resumeHeld() // what they ask goes out below
	}
	if len(ls.ending) > 0 {
		ls.finishEnded()
	}
	for again := true; again; {
		again = false
		for _, u := range ls.upList {
			gc := u.gc
			u.flush()
			again = again || (gc != nil && u.gc != gc)
		}
	}
	if len(ls.moving) > 0 {
		ls.moveClients()
	}
	ls.nowTaken = false
	ls.polls++
}

// OnReadEnd keeps a plain client that ended its side until it has its
// replies (see leave); an upstream server, or a TLS client, that ends
// its side is closed.
func (l *eventLoops) OnReadEnd(gc *evloop.Conn) evloop.Action {
	lc, ok := gc.Context().(*loopClient)
	if !ok || lc.tls != nil {
		return evloop.Close
	}
	lc.ls.clock()
	return lc.leave()
}

func (l *eventLoops) OnClose(gc *evloop.Conn, err error) {
	switch x := gc.Context().(type) {
	case *loopClient:
		x.ls.clock()
		x.closed()
	case *loopUpstream:
		x.ls.clock()
		if x.gc == gc {
			x.gc, x.tls = nil, nil
			if err == nil {
				err = net.ErrClosed
			}
			x.fail(err)
		}
	}
}

// check times out upstream requests, closes idle clients, and closes
// clients with nothing owed once the proxy is draining.
func (ls *loopState) check() {
	p, now := ls.l.p, ls.now
	for srv, u := range ls.ups {
		switch {
		case srv.Closed() && u.q.len() == 0:
			// Discovery took the server out of the set, and what was
			// asked of it before is answered.
			u.abort(net.ErrClosed)
			delete(ls.ups, srv)
			ls.upList = slices.DeleteFunc(ls.upList, func(x *loopUpstream) bool { return x == u })
		case u.sent > 0 && now.Sub(u.q.front().waitFrom) > p.cfg.Timeout:
			// The oldest request written was not answered in time: the
			// timeout bounds every upstream request, however its reply
			// trickles in. Unless its reply came while the loop was busy
			// with others (a poll's work can take longer than the timeout
			// on a loaded machine): it is failed only once a poll has
			// passed since it was first seen late, which read what its
			// socket held.
			if from := u.q.front().waitFrom; !u.late.Equal(from) {
				u.late, u.latePoll = from, ls.polls
			} else if ls.polls > u.latePoll {
				u.abort(os.ErrDeadlineExceeded) // answered as a timeout
			}
		}
	}
	idle := p.cfg.IdleTimeout
	for lc := range ls.clients {
		lc.noteOut()
		switch {
		case lc.full() || lc.held && lc.waits() && lc.gc.OutboundBuffered() > 0:
			// Its replies, or its requests, wait for it to read those
			// evloop holds.
			if idle > 0 && now.Sub(lc.last) > idle {
				lc.closeIdle()
			}
		case lc.held:
			// Unless its requests wait for replies memcached has yet to
			// send, which is no idling.
			if !lc.waits() {
				lc.resume()
			}
		case len(lc.slots) > 0:
		case p.draining() && !lc.inBlock():
			// Not while a value is arriving: that request is in flight
			// (only the idle clock ends it).
			// Nor before evloop wrote all: it would drop the rest.
			if lc.gc.OutboundBuffered() == 0 {
				lc.closeSelf()
			}
		case idle > 0 && now.Sub(lc.last) > idle:
			// No request completed for that long (bytes that make none
			// do not count), as memcached's idle_timeout counts.
			lc.closeIdle()
		}
	}
	if len(ls.ending) > 0 {
		ls.finishEnded()
	}
}
