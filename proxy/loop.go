package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"math/bits"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"mcsidecar/codec"
	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/sockio"
	"mcsidecar/proxy/internal/wire"
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
// The loop answers the commands store-gateways send all day: get and
// gets, the storage commands (values enveloped and keys rewritten as on
// the goroutine path), delete, touch, incr and decr, and version; not the
// read-modify-writes of enveloped values. With zones, a retrieval falls
// through the zones as on the goroutine path, the hits of other zones
// filling the local one, and writes keep the zones in line as there. The
// local tier is read first, and filled, as there too: local tier, local
// zone, other zones.
// At the first command it does not answer, the connection is handed, with
// the bytes it has not read yet and the replies still owed, to the
// goroutine path, which answers everything.

// loopTick is how often each loop checks its upstream deadlines, idle
// clients and a shutdown.
var loopTick = 10 * time.Millisecond // a var: a test puts it out of reach

// loopReadBuffer is how much each read of a loop takes at most (evloop's
// read buffer, one per loop; evloop's default is 64 KiB). A memcached reply
// to a 100-key get of 3 KiB values is about 300 KiB over four servers:
// with 256 KiB the loop reads it in 3.5 reads a request instead of 6.4.
const loopReadBuffer = 256 << 10

// loopPendMin is the length from which a storage command (line, value and
// CRLF) whose value has not all come in one read gathers in a buffer of its
// own, which the rest is read straight into (loopClient.pend), rather than
// in evloop's buffer, from which it would be copied twice more. It does once
// half of it has come: memory follows what arrives, not what a request
// says will (a buffer for a request of n bytes holds up to 2n).
const loopPendMin = 64 << 10

// loopMaxSlots is how many replies one client may owe before the loop
// stops reading its requests until some are written.
const loopMaxSlots = 256

// loopUnreadMax is the most bytes of requests a client may have sent that
// the loop is not answering yet because the client reads its replies too
// slowly or is to be handed over, and loopPipelinedMax the most while it
// owes loopMaxSlots replies and reads them. Past them, the connection
// moves to the goroutine path, which reads no more requests than it
// answers: evloop has no way to stop reading a socket. A client that
// pipelines a bulk load and reads every reply stays on the loop up to the
// second.
const (
	loopUnreadMax    = 16 * loopReadBuffer
	loopPipelinedMax = 256 * loopReadBuffer
)

// loopOutMax is the most bytes of a client's replies evloop holds, written
// once the socket has room. A client that reads its replies slower than
// that makes the loop hold its next replies where they are and answer no
// more of its requests, until evloop holds less again (checked at the end
// of each poll of its loop, and every loopTick); so a client that sends
// gets and reads no replies costs the proxy what it sent, up to
// loopUnreadMax, not the replies.
const loopOutMax = loopCopyMax

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
	// held: the clients held back (loopClient.held), which OnPollEnd
	// resumes once evloop holds few enough of their replies; heldSpare is
	// the array the next pass fills.
	held, heldSpare []*loopClient
	slots           []*loopSlot
	reqs            []*loopReq
	shares          []*loopShare
	// chunks are the chunks of loopChunk bytes to read replies into that
	// no reply refers to any more, and long the longer ones, of longKept
	// bytes in all; made is the bytes of the chunks allocated.
	chunks, long   [][]byte
	longKept, made int
	dec            []byte // a value being opened
	sealBuf        []byte // a reply to a TLS client, before encryption
	// now is when the loop began handling the events of its current
	// poll: the clock is read at the first event of a poll (see clock),
	// not per event or per request, and OnPollEnd has the next poll read
	// it anew. A poll takes microseconds, a few milliseconds at most;
	// the upstream timeout and the latency histograms are coarser.
	now      time.Time
	nowTaken bool
	// tags numbers the loop's slots (loopSlot.tag).
	tags uint32
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

// loopClient is one client connection on a loop.
type loopClient struct {
	c     *conn
	gc    *evloop.Conn
	ls    *loopState
	slots []*loopSlot // replies owed, in request order
	// handoff asks OnClose to hand the connection to the goroutine path;
	// closing marks a close the loop asked for itself.
	handoff, closing bool
	hangUp           bool // the command handed over is an HTTP request
	inProcess        bool // process is running: replies made meanwhile are written when it ends
	inTraffic        bool // in the client's own OnTraffic, which closes it by its return
	writing          bool // written is running
	held             bool // replies or requests wait until evloop holds fewer bytes of replies (loopOutMax)
	inHeld           bool // in loopState.held
	unread           int  // bytes buffered that were already counted
	last             time.Time
	hand             *handover // replies owed to a connection handed over
	iov              []syscall.Iovec
	tls              *loopTLS // the connection's TLS server, with --tls-cert-path
	kept             []byte   // a copy of at least the bytes evloop holds to write (see keep)
	// What the client is owed (see output.go): the bytes its slots are
	// charged, the bytes evloop held for it when last looked at, a key's
	// share of its replies lately, at most, and the keys of the retrieval
	// it is held back at (0: none).
	charged, outSeen, perKey, need int
	// want is how many bytes the first request buffered needs before it
	// is parsed again: a storage command whose value is still arriving,
	// or 0. evloop gathers a long value from many reads, and parsing it
	// after each would copy all of it that came so far each time.
	want int
	// pend, over plain TCP, is instead the first request buffered when
	// it is a storage command of at least loopPendMin bytes whose value
	// is still arriving and half of which has come: the bytes come so
	// far, with the request's length for capacity, in pendSh's chunk or,
	// under a chunk's size, an array of their own. The rest is read
	// straight into it (ReadInto), and the request handled from it once
	// whole.
	pend   []byte
	pendSh *loopShare
	// counted: the socket counts the bytes it was given (sockio.Written),
	// so the connection can move while evloop holds some (TCP on Linux).
	counted bool
}

// loopSlot is one reply owed to a client: ready when no request of it is
// pending upstream.
type loopSlot struct {
	client  *loopClient
	id      int
	noreply bool
	began   time.Time
	pending int
	out     [][]byte // the reply, once ready
	line    []byte   // a copy of a storage command's reply line
	// A retrieval's keys, back to back in keys and ending at ends[i],
	// where each one's answer is, and its requests, one per server. The
	// rewrites of keys sent rewritten are back to back in ups.
	keys   []byte
	ends   []int
	ups    []byte
	arena  []byte // VALUE blocks written anew, see loopOwner
	owners []loopOwner
	reqs   []*loopReq
	seen   []int32 // 1 + the owner of each key, by hash, in a retrieval of many
	// zone is the zone a retrieval asks now, whose requests are
	// reqs[zoneStart:].
	zone, zoneStart int
	// What a storage command's write adds to the byte counters once
	// stored.
	write loopWrite
	// tag is the opaque token an incr or decr is sent upstream with, which
	// its reply must echo (see wire.AppendArith).
	tag uint32
	// charge is what the slot is charged against its client's
	// --max-client-output-bytes (see output.go).
	charge int
}

// loopWrite is what a storage command's write adds to the byte counters
// once stored: the bytes written, per tenant, and for an enveloped value,
// the client's bytes and the stored ones.
type loopWrite struct {
	tenant    *tenantCounters
	size      int
	enveloped bool
	logical   int
}

// named returns the owner of the first key equal to k among the n keys
// of a retrieval whose first i are in s, or -1. A short retrieval scans
// them; a long one keeps a table of them by hash.
func (s *loopSlot) named(k []byte, i, n int) int {
	if n > seenScanMax {
		// Open addressing in a table of at least twice n entries.
		if i == 0 {
			size := 1 << bits.Len(uint(2*n-1))
			s.seen = slices.Grow(s.seen[:0], size)[:size]
			clear(s.seen)
		}
		mask := len(s.seen) - 1
		for h := int(maphash.Bytes(loopSeed, k)) & mask; ; h = (h + 1) & mask {
			j := int(s.seen[h]) - 1
			if j < 0 {
				s.seen[h] = int32(i + 1)
				return -1
			}
			if bytes.Equal(s.key(j), k) {
				return j
			}
		}
	}
	for j := range i {
		if s.owners[j].first == 0 && bytes.Equal(s.key(j), k) {
			return j
		}
	}
	return -1
}

// key returns the slot's i-th key.
func (s *loopSlot) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.ends[i-1]
	}
	return s.keys[start:s.ends[i]]
}

// upKey returns the upstream key of the i-th key of a retrieval.
func (s *loopSlot) upKey(i int) []byte {
	if o := &s.owners[i]; o.bound {
		return s.ups[o.upStart:o.upEnd]
	}
	return s.key(i)
}

// loopOwner is where one requested key's answer is: a VALUE block in its
// request's reply, or nil for a miss.
type loopOwner struct {
	first  int // 1 + the owner of the same key named earlier; 0: none
	block  []byte
	flags  uint32
	size   int
	cas    uint64
	hasCAS bool
	tenant *tenantCounters
	// bound: the key is sent rewritten, as ups[upStart:upEnd], and its
	// value is an envelope bound to it.
	bound          bool
	upStart, upEnd int
	// The block written anew (opened, its CAS dropped, or another zone's
	// hit) is arena[arenaStart:arenaEnd]; arenaEnd is 0 for one that is
	// not.
	arenaStart, arenaEnd int
	// zone is the zone the key was last asked of, and meta says its
	// block is an mg reply, "VA …" and the value, with the item's time
	// to live in ttl: as other zones are asked, and every zone with the
	// local tier on.
	zone int
	meta bool
	ttl  int32
	err  error // the failure of the request that last asked for the key
	// The local tier: immutable says the key's value never changes, so
	// the tier may keep it, and gen is the count of its write stripe
	// before it was last asked upstream, for the tier and a fill (see
	// writeGuard); inTier, that the tier answered it, from the arena.
	immutable, inTier bool
	gen               uint64
}

// stored returns the value of o's block as memcached holds it.
func (o *loopOwner) stored() []byte { return o.block[len(o.block)-o.size-2 : len(o.block)-2] }

// loopReq is one request on an upstream connection: a server's share of a
// retrieval (meta: one mg per key, as other zones are asked), a command
// of one key (store), or one whose reply is dropped once it came (drop
// says why).
type loopReq struct {
	slot  *loopSlot
	srv   *upstream.Server
	store bool
	meta  bool
	drop  uint8
	zone  int // the zone a dropAlign request brings in line
	began time.Time
	asked []int  // owner indexes, in the order the keys were asked
	buf   []byte // the reply, which the owners' blocks point into
	err   error
	// joined is how many requests after this one in the queue share its
	// get line (see loopUpstream.join); share, the chunk buf is in.
	joined int
	share  *loopShare
	// ends marks the last request of one write upstream (a batch).
	ends bool
	// expect is the family of the reply to a command of one key.
	expect wire.Reply
	// A fill's key, and the count of its write stripe its read noted
	// (see writeGuard); undo, that a write raced it and it is deleted
	// again (dropUnfill, whose key it is too).
	key  []byte
	gen  uint64
	undo bool
}

// loopShare is a chunk that replies are read into (see
// loopUpstream.chunk): the requests whose replies are in it refer to it,
// and so does its connection while it reads into it. It is given back
// when the last of them lets go.
type loopShare struct {
	buf  []byte
	refs int
}

// loopUpstream is one loop's connection to one server.
type loopUpstream struct {
	ls      *loopState
	srv     *upstream.Server
	gc      *evloop.Conn
	dialing bool
	out     []byte   // requests not written yet
	q       reqQueue // requests in order; the first sent are written
	sent    int
	scan    replyScan
	// chunk is what replies are read into while one is being read:
	// scan.acc is the tail of it, from where that reply begins.
	chunk *loopShare
	tls   *loopTLS // the connection's TLS client, with --upstream-tls-enabled
	// batchErr is the first error a reply of the oldest batch in flight
	// was; batches, how many are in flight.
	batchErr error
	batches  int
	// join is the request whose get line ends out at joinEnd, which the
	// next retrieval's keys may join (see ask).
	join              *loopReq
	joinEnd, joinKeys int
	joined            []*loopReq // the requests of the reply being answered
	// replyMean is a moving mean of the bytes of a retrieval's reply, per
	// request: past loopJoinReplyMax, retrievals join no get line.
	replyMean int
}

// loopJoinKeys is the most keys of a request that joins a get line or is
// joined: memcached answers a get of more with few system calls a value
// already, and a longer reply shared would hold each client's back longer
// for the others'. Measured with 25 keys a request (the comparison's load
// 3), joining them cost the proxy more CPU than it spared.
const loopJoinKeys = 16

// loopJoinReplyMax is the most bytes the replies to a connection's
// retrievals of up to loopJoinKeys keys may have had, on a moving mean,
// for the next to join a get line. Joining spares memcached
// a command and the proxy a line, which is nothing next to long values,
// and a reply shared by many clients' long values is long: it outgrows
// chunk after chunk, each move copying all of it read so far. Measured on
// 700 KB values (compare.sh's load 5), with chunks kept (see chunk), not
// joining them took the proxy's CPU a request from about twice twemproxy's
// to about as much.
const loopJoinReplyMax = loopChunkRoom

// joinable returns the request whose get line ends the requests not yet
// written, when a retrieval of n keys by command id may add its keys to
// that line, or nil. A line holds at most --upstream-get-batch-keys keys.
//
// memcached 1.6 writes the reply to each get of a pipeline with a system
// call of its own, and the reply to one get of many keys with one, so
// that joining the gets of many clients spares it most of its writes.
// Only gets next to each other in the queue are joined: no request moves
// past another, so a client's set and its get after it stay in order.
func (u *loopUpstream) joinable(id, n int) *loopReq {
	h := u.join
	if h == nil || n > loopJoinKeys || u.replyMean > loopJoinReplyMax || len(u.out) != u.joinEnd || u.q.len() == u.sent ||
		(h.slot.id == cmdGets) != (id == cmdGets) || u.joinKeys+n > u.ls.l.p.cfg.GetBatchKeys {
		return nil
	}
	return h
}

// Why a request's reply is dropped.
const (
	dropCorrupt = iota + 1 // the delete of a damaged item
	dropFill               // a hit of another zone stored into the local one
	dropAlign              // a write bringing another zone in line
	dropUndo               // the delete of a copy an add refused elsewhere made
	dropUnfill             // the delete of a fill that a write raced
)

// reqQueue is a connection's requests in order: a slice read from head,
// whose array is used again once every request in it is answered.
type reqQueue struct {
	buf  []*loopReq
	head int
}

func (q *reqQueue) len() int        { return len(q.buf) - q.head }
func (q *reqQueue) front() *loopReq { return q.buf[q.head] }
func (q *reqQueue) all() []*loopReq { return q.buf[q.head:] }

// push adds r at the end. A full array whose first requests are answered
// has the rest moved down first, so that a queue that never empties does
// not grow.
func (q *reqQueue) push(r *loopReq) {
	if len(q.buf) == cap(q.buf) && q.head > 0 {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	q.buf = append(q.buf, r)
}

// pop takes the first request off.
func (q *reqQueue) pop() {
	q.buf[q.head] = nil
	if q.head++; q.head == len(q.buf) {
		q.buf, q.head = q.buf[:0], 0
	}
}

// Free lists: what a finished request gives back, bounded so that a burst
// does not stay allocated.
const (
	loopFreeMax  = 1024
	loopBufLimit = 1 << 20
	loopSeenKeep = 4096 // entries of a repeat table kept with a free slot
	loopLineKeep = 1024 // bytes of a storage command's reply line kept with a free request

	// loopChunksKept is how many chunks of loopChunk bytes a loop keeps
	// for reading replies into (see loopUpstream.chunk) once no reply in
	// them is referred to. A reply of long values is read into a chunk of
	// its size (see chunk); one allocated for each would be zeroed and its
	// pages faulted in each time, and be cold in the CPU's cache when
	// written to the client. Of those longer chunks the loop keeps up to
	// loopLongChunksBytes, none over loopChunkKeepMax: kept apart, so that
	// a burst of short replies does not leave no room for long ones.
	loopChunksKept      = 32
	loopLongChunksBytes = 16 << 20
	loopChunkKeepMax    = 4 << 20
)

// loopSeed seeds the hashes of the keys a retrieval looks for repeats of.
var loopSeed = maphash.MakeSeed()

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
	s.client, s.id, s.began, s.tag = lc, id, ls.now, ls.tags
	return s
}

func (ls *loopState) req(s *loopSlot) *loopReq {
	r := take(&ls.reqs)
	r.slot, r.began = s, s.began
	return r
}

// chunk returns a chunk to read replies into, of at least n bytes: of
// those given back, the smallest large enough, the last one given back of
// those, whose bytes are the likeliest to be in the CPU's cache. A chunk
// for a long reply is a power of two in size, so that replies of about
// one size take turns in one.
func (ls *loopState) chunk(n int) *loopShare {
	n = max(n, loopChunk)
	if n > loopChunk && n <= loopChunkKeepMax {
		n = 1 << bits.Len(uint(n-1))
	}
	sh := take(&ls.shares)
	sh.refs = 1
	if k := len(ls.chunks); n == loopChunk && k > 0 {
		sh.buf = ls.chunks[k-1]
		ls.chunks[k-1] = nil
		ls.chunks = ls.chunks[:k-1]
		return sh
	}
	best := -1
	for k, b := range ls.long {
		if cap(b) >= n && (best < 0 || cap(b) <= cap(ls.long[best])) {
			best = k
		}
	}
	if best < 0 {
		sh.buf = make([]byte, 0, n)
		ls.made += n
		return sh
	}
	sh.buf = ls.long[best]
	ls.long = slices.Delete(ls.long, best, best+1)
	ls.longKept -= cap(sh.buf)
	return sh
}

// release drops one reference to a chunk, and takes it back once no reply
// in it is referred to any more.
func (ls *loopState) release(sh *loopShare) {
	if sh.refs--; sh.refs > 0 {
		return
	}
	// A reply that outgrew its chunk may have moved to a smaller array
	// (see adopt): only whole chunks are kept, or one would sit on top.
	switch b, n := sh.buf, cap(sh.buf); {
	case n == loopChunk && len(ls.chunks) < loopChunksKept:
		ls.chunks = append(ls.chunks, b[:0])
	case n > loopChunk && n <= loopChunkKeepMax && ls.longKept+n <= loopLongChunksBytes:
		ls.long = append(ls.long, b[:0])
		ls.longKept += n
	}
	*sh = loopShare{}
	if len(ls.shares) < loopFreeMax {
		ls.shares = append(ls.shares, sh)
	}
}

func (ls *loopState) putReq(r *loopReq) {
	buf := r.buf[:0] // a storage command's reply line, a copy of its own
	if r.share != nil {
		ls.release(r.share)
		buf = nil
	}
	if cap(buf) > loopLineKeep {
		buf = nil
	}
	*r = loopReq{asked: r.asked[:0], buf: buf, key: r.key[:0]}
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
	seen, arena := s.seen, s.arena
	*s = loopSlot{out: s.out[:0], line: s.line[:0], keys: s.keys[:0], ends: s.ends[:0], ups: s.ups[:0], owners: s.owners[:0], reqs: s.reqs[:0]}
	if cap(arena) <= loopBufLimit {
		s.arena = arena[:0]
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
		close(l.stopped)
	})
}

// enroll moves an accepted connection onto a loop.
func (l *eventLoops) enroll(c *conn) error {
	lc := &loopClient{c: c, last: time.Now()}
	c.lc = lc
	_, err := l.cli.Enroll(c.nc, lc)
	return err
}

// enrollTLS makes the TLS handshake of an accepted connection, whose
// socket is raw, and then moves it onto a loop. The TLS server speaks
// through a bridge, as a loop's TLS clients do upstream (see loopTLS).
// The handshake is bounded by --idle-timeout, as the goroutine path's
// first read is.
func (l *eventLoops) enrollTLS(c *conn, raw net.Conn, t *loopTLS) {
	if d := l.p.cfg.IdleTimeout; d > 0 {
		raw.SetDeadline(time.Now().Add(d))
	}
	err := t.conn.Handshake()
	raw.SetDeadline(time.Time{})
	if err == nil {
		lc := &loopClient{c: c, last: time.Now(), tls: t}
		c.lc = lc
		// While the loop has it, the connection's socket is the one evloop
		// closes once it has a duplicate, as for a plain client: closing
		// the TLS session from elsewhere would write into the bridge.
		// A shutdown reaches the socket under wakeMu.
		c.wakeMu.Lock()
		c.nc, t.b.loop = raw, true
		c.wakeMu.Unlock()
		_, err = l.cli.Enroll(raw, lc)
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
		_, err := sockio.Written(gc.Fd())
		x.counted = err == nil
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
	for again := true; again; {
		again = false
		for _, u := range ls.upList {
			gc := u.gc
			u.flush()
			again = again || (gc != nil && u.gc != gc)
		}
	}
	ls.nowTaken = false
}

// resumeHeld resumes the clients held back that evloop has written enough
// of the replies of: a write of the poll that ended may have been theirs.
// The rest wait for a later poll, or for the tick.
func (ls *loopState) resumeHeld() {
	held := ls.held
	ls.held = ls.heldSpare[:0]
	for _, lc := range held {
		if _, open := ls.clients[lc]; !open || !lc.held {
			lc.inHeld = false // closed, or resumed by the tick
			continue
		}
		if lc.waits() {
			ls.held = append(ls.held, lc)
			continue
		}
		lc.inHeld = false
		lc.resume()
	}
	clear(held)
	ls.heldSpare = held[:0]
}

// hold holds the client's replies and requests back until evloop holds
// fewer of its replies than loopOutMax, and the retrieval it is held back
// at, if any, fits (see waits).
func (lc *loopClient) hold() {
	lc.held = true
	if !lc.inHeld {
		lc.inHeld = true
		lc.ls.held = append(lc.ls.held, lc)
	}
}

// resume writes the replies a client was held back from, and answers the
// requests held back with them: once no reply is owed, or, for a client
// held back for its output limit, as soon as there is room.
func (lc *loopClient) resume() {
	room := lc.need > 0
	lc.held, lc.need = false, 0
	if len(lc.slots) > 0 {
		lc.written() // and, once none is owed, the requests held back with them
		if !room || len(lc.slots) == 0 || lc.gc == nil || lc.held {
			return
		}
	}
	lc.processHeld()
}

// processHeld runs process outside traffic, for requests held back, and
// keeps unread in step: the bytes it handled were counted as read when
// they came, and those after them must be counted when more come. A
// request among them that the loop hands over, with no reply owed before
// it, moves the connection now, as traffic's return would.
func (lc *loopClient) processHeld() {
	lc.process()
	if lc.gc == nil {
		return
	}
	lc.unread = lc.buffered()
	if !lc.inTraffic && lc.moveNow() {
		lc.gc.Close()
	}
}

func (l *eventLoops) OnClose(gc *evloop.Conn, err error) {
	switch x := gc.Context().(type) {
	case *loopClient:
		x.ls.clock()
		x.closed(err)
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
		case u.sent > 0 && now.Sub(u.q.front().began) > p.cfg.Timeout:
			// The oldest request written was not answered in time: the
			// timeout bounds every upstream request, however its reply
			// trickles in.
			u.abort(os.ErrDeadlineExceeded) // what a deadline gives the goroutine path
		}
	}
	idle := p.cfg.IdleTimeout
	for lc := range ls.clients {
		if lc.kept != nil && lc.gc.OutboundBuffered() == 0 {
			lc.kept = nil // an idle connection keeps no buffer
		}
		lc.noteOut()
		switch {
		case lc.moveNow():
			lc.gc.Close()
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
			// (only the idle clock ends it, as on the goroutine path).
			// Nor before evloop wrote all: it would drop the rest.
			if lc.gc.OutboundBuffered() == 0 {
				lc.closing = true
				lc.gc.Close()
			}
		case idle > 0 && now.Sub(lc.last) > idle:
			// No request completed for that long (bytes that make none
			// do not count), as on the goroutine path.
			lc.closeIdle()
		}
	}
}

// traffic handles every request that has arrived whole.
func (lc *loopClient) traffic() evloop.Action {
	var readErr error
	if lc.tls != nil {
		readErr = lc.tls.read(lc.gc)
		if lc.putSealed(); lc.gc == nil {
			return evloop.None // the write of TLS's own answer failed
		}
	}
	n := lc.buffered()
	if n > lc.unread {
		lc.c.p.stats.bytesRead.Add(uint64(n - lc.unread))
	}
	lc.inTraffic = true
	lc.process()
	lc.inTraffic = false
	if lc.gc == nil {
		return evloop.None // a write failed and closed the connection
	}
	lc.unread = lc.buffered()
	switch {
	case readErr == nil:
	case readErr == io.EOF && (len(lc.slots) > 0 || lc.unread > 0 || lc.counted && lc.gc.OutboundBuffered() > 0):
		// The client ended its TLS session after requests not all
		// answered: as a plain client that half-closes, the connection
		// moves to the goroutine path once the loop's replies are
		// written, which answers the rest and then sees the end.
		lc.handoff = true
	default:
		// Ended with nothing owed, or broken: closed at once.
		lc.closing = true
		return evloop.Close
	}
	if lc.piledUp() {
		// evloop cannot stop reading a socket; the goroutine path reads no
		// more than it answers, as memcached does: the client waits there.
		lc.handoff = true
		return evloop.Close
	}
	if lc.moveNow() || len(lc.slots) == 0 && lc.c.p.draining() && lc.gc.OutboundBuffered() == 0 && !lc.inBlock() {
		return evloop.Close // what written leaves to this callback's return
	}
	return evloop.None
}

// piledUp reports whether the client sent more requests than the loop
// lets wait (see loopUnreadMax).
func (lc *loopClient) piledUp() bool {
	switch {
	case lc.unread > loopPipelinedMax:
		return lc.movable()
	case lc.unread > loopUnreadMax:
		return (lc.held || lc.handoff) && lc.movable()
	}
	return false
}

// moveNow reports whether a connection the loop hands over moves now: no
// reply is owed on the loop, and it is movable.
func (lc *loopClient) moveNow() bool {
	return lc.handoff && len(lc.slots) == 0 && lc.movable()
}

// movable reports whether the connection can move to the goroutine path
// now: evloop holds none of its replies, or the socket counts what evloop
// writes of them before it drops the rest (see unwritten).
func (lc *loopClient) movable() bool {
	return lc.counted || lc.gc.OutboundBuffered() == 0
}

// unhandled returns the bytes gc brought that are not handled yet: evloop's,
// or with TLS (t) the decrypted ones.
func unhandled(gc *evloop.Conn, t *loopTLS) []byte {
	if t != nil {
		return t.plain
	}
	b := gc.Peek()
	return b
}

// handle drops the first n bytes of unhandled(gc, t).
func handle(gc *evloop.Conn, t *loopTLS, n int) {
	if t != nil {
		t.took(n)
	} else if n > 0 {
		gc.Discard(n)
	}
}

// inBlock reports whether the first request buffered is a storage
// command whose value is still arriving (see want and pend). A shutdown
// lets it come, as on the goroutine path.
func (lc *loopClient) inBlock() bool { return lc.want > 0 || lc.pend != nil }

// buffered is how many request bytes arrived and are not handled yet.
func (lc *loopClient) buffered() int {
	if lc.tls != nil {
		return len(lc.tls.plain)
	}
	return len(lc.pend) + lc.gc.InboundBuffered()
}

// process answers the whole requests buffered, until it meets one it
// hands over.
func (lc *loopClient) process() {
	if lc.handoff || lc.inProcess {
		return
	}
	if lc.waits() {
		lc.hold()
		return
	}
	if lc.want > 0 {
		if n := lc.buffered(); n < lc.want && !lc.pendable(lc.want, n) {
			return
		}
		lc.want = 0
	}
	lc.inProcess = true
	first := len(lc.slots) // the replies to this read
	if lc.pend != nil && (len(lc.slots) >= loopMaxSlots || !lc.gather()) {
		lc.inProcess = false
		return
	}
	data := unhandled(lc.gc, lc.tls)
	off := 0
	for off < len(data) && len(lc.slots) < loopMaxSlots {
		n, ok := lc.request(data[off:])
		if !ok {
			lc.handoff = true
			if lc.hangUp {
				// memcached hangs up on an HTTP request without sending
				// the replies to the commands read with it.
				for _, s := range lc.slots[first:] {
					s.noreply = true
				}
			}
			break
		}
		if n == 0 {
			break // wants more bytes
		}
		off += n
	}
	if off > 0 {
		handle(lc.gc, lc.tls, off)
		if off > len(lc.pend) { // not only the start of a request
			lc.last = lc.ls.now
		}
	}
	lc.inProcess = false
	if len(lc.slots) > 0 && lc.slots[0].pending == 0 {
		lc.written() // replies made here: version, a request to an ejected server
	}
}

// zoneHeld reports whether, with zones, request id waits for a request
// of the client's in flight that may still reach another zone, where the
// new one, sent at once, would come first (the goroutine path runs a
// client's requests one after the other):
//   - every request waits for a write tried zone by zone, or an add to
//     every zone, whose reply comes once the zones are in line;
//   - a write waits for a get or gets, which may yet ask another zone
//     for a key the local one lacks.
//
// A request held is parsed again once the client's replies are written.
func (lc *loopClient) zoneHeld(id int) bool {
	p := lc.c.p
	if len(p.zones) < 2 || len(lc.slots) == 0 {
		return false
	}
	// Nothing is read after such a write while it is in flight: it is
	// the last slot.
	if s := lc.slots[len(lc.slots)-1]; s.pending > 0 && (p.zoneByZone(s.id) || s.id == cmdAdd) {
		return true
	}
	if id == cmdGet || id == cmdGets || id == cmdVersion {
		return false
	}
	for _, s := range lc.slots {
		if s.pending > 0 && (s.id == cmdGet || s.id == cmdGets) {
			return true
		}
	}
	return false
}

// gather moves what evloop read to pend, without a copy when it was read
// straight into place, and once pend holds the whole request, handles it.
// It reports whether it did. A request that cannot be handled on the loop
// stays in pend, which closed hands over with the bytes after it.
func (lc *loopClient) gather() bool {
	data := unhandled(lc.gc, nil)
	n := min(len(data), cap(lc.pend)-len(lc.pend))
	if n > 0 {
		if tail := lc.pend[len(lc.pend) : len(lc.pend)+1]; &data[0] == &tail[0] {
			lc.pend = lc.pend[:len(lc.pend)+n]
			lc.c.p.stats.clientReadsInPlace.Add(1)
		} else {
			lc.pend = append(lc.pend, data[:n]...)
		}
		handle(lc.gc, nil, n)
	}
	if len(lc.pend) < cap(lc.pend) {
		return false
	}
	if n, ok := lc.request(lc.pend); !ok || n != len(lc.pend) {
		lc.handoff = true
		return false
	}
	lc.dropPend()
	lc.last = lc.ls.now
	return true
}

// pendable reports whether a storage command of total bytes, got of
// which have come, goes on in pend.
func (lc *loopClient) pendable(total, got int) bool {
	return lc.tls == nil && total >= loopPendMin && 2*got >= total
}

// dropPend gives back pend's chunk.
func (lc *loopClient) dropPend() {
	if lc.pendSh != nil {
		lc.ls.release(lc.pendSh)
	}
	lc.pend, lc.pendSh = nil, nil
}

// request answers the request at the start of data, or leaves it: it
// returns how many bytes it took (0: it needs more) and false for a
// request the loop does not answer.
func (lc *loopClient) request(data []byte) (int, bool) {
	c := lc.c
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		return 0, len(data) <= lineLimit
	}
	line := data[:i]
	if len(line) == 0 || line[len(line)-1] != '\r' || bytes.IndexByte(line, 0) >= 0 {
		return 0, false
	}
	cmd, words, v := parseLine(c.words, line[:len(line)-1])
	c.words = words
	if v != verdictRun {
		lc.hangUp = v == verdictClose
		return 0, false
	}
	if lc.zoneHeld(cmd.id) {
		return 0, true // parsed again once the replies owed are written
	}
	switch cmd.id {
	case cmdGet, cmdGets:
		if lc.outputFull(len(words) - 1) {
			return 0, true // parsed again once the client has read
		}
		return i + 1, lc.retrieve(cmd.id, words[1:])
	case cmdSet, cmdAdd, cmdReplace, cmdAppend, cmdPrepend, cmdCas:
		return lc.store(cmd.id, words, data, i+1)
	case cmdDelete, cmdTouch, cmdIncr, cmdDecr:
		return i + 1, lc.keyCommand(cmd.id, words)
	case cmdVersion:
		lc.version()
		return i + 1, true
	}
	return 0, false
}

// version answers version, which some clients send when they connect, in
// its place among the replies owed.
func (lc *loopClient) version() {
	p := lc.c.p
	s := lc.ls.slot(lc, cmdVersion)
	s.line = append(append(append(s.line[:0], "VERSION "...), p.version...), crlf...)
	s.out = append(s.out, s.line)
	lc.slots = append(lc.slots, s)
	p.stats.record(cmdVersion, outcomeOK)
}

// validKey reports whether the loop may take key: one memcached accepts,
// and, without key settings, one gomemcache would send. Nothing is
// counted: a key it declines is refused, and counted, by the goroutine
// path.
func (lc *loopClient) validKey(key []byte) bool {
	ks := lc.c.p.keys
	if ks == nil {
		return len(key) <= keyMaxLength && forwardable(key)
	}
	ok, _ := ks.Check(key)
	return ok
}

// rewritten reports whether a valid key is sent upstream rewritten.
func (lc *loopClient) rewritten(key []byte) bool {
	ks := lc.c.p.keys
	return ks != nil && ks.NeedsRewrite(key)
}

// retrieve sends a get or gets to the servers of its keys, one request
// per server.
func (lc *loopClient) retrieve(id int, keys [][]byte) bool {
	c := lc.c
	for _, k := range keys {
		if !lc.validKey(k) {
			return false
		}
	}
	p := c.p
	up := p.zones[0].up.Load()
	ls := lc.ls
	s := ls.slot(lc, id)
	lc.charge(s, lc.estimate(len(keys)))
	need := needTenant
	if p.tier != nil {
		need |= needImmutable
	}
	var ups [4]*loopUpstream // each request's server; more than four are rare
	reqUps := ups[:0]
	for i, k := range keys {
		// A key named again is fetched once and answered as often as it
		// was named, as memcached does.
		first := s.named(k, i, len(keys))
		s.keys = append(s.keys, k...)
		s.ends = append(s.ends, len(s.keys))
		rk := c.resolve(k, need)
		o := loopOwner{first: first + 1, tenant: p.tenants.counters(rk.tenant), bound: rk.bound, immutable: rk.immutable}
		if rk.bound {
			o.upStart = len(s.ups)
			s.ups = append(s.ups, rk.up...)
			o.upEnd = len(s.ups)
		}
		if rk.immutable {
			// get answers from the tier; gets needs memcached's CAS. A key
			// named again is answered as the first time, but looked up
			// again, so that the tier counts every naming, as memcached's
			// get_hits do.
			e, gen := p.fromTier(k, string(rk.up), id == cmdGet, s.began.UnixNano())
			if first < 0 {
				o.gen = gen
				if e != nil {
					o.inTier = true
					s.inArena(&o, k, e.Flags, e.Value, 0, false)
				}
			}
		}
		s.owners = append(s.owners, o)
		if first >= 0 || o.inTier {
			continue
		}
		reqUps = s.group(reqUps, 0, ls.upstreamOf(up, rk.up), i)
	}
	lc.slots = append(lc.slots, s)
	c.lastCmd.Store(s.began.UnixNano())
	// With the local tier on, keys are asked with mg, which tells the time
	// to live an entry needs. The requests go out in OnPollEnd.
	s.send(reqUps, 0, p.tier != nil)
	if s.pending == 0 {
		s.finish() // every key answered by the tier, or failed
	}
	return true
}

// group adds the retrieval's i-th key to its request to u among those
// from reqs[start:], one per server of reqUps, made when first needed,
// and returns reqUps.
func (s *loopSlot) group(reqUps []*loopUpstream, start int, u *loopUpstream, i int) []*loopUpstream {
	ri := slices.Index(reqUps, u)
	if ri < 0 {
		ri = len(reqUps)
		reqUps = append(reqUps, u)
		s.reqs = append(s.reqs, s.client.ls.req(s))
	}
	r := s.reqs[start+ri]
	r.asked = append(r.asked, i)
	return reqUps
}

// send queues the retrieval's requests from reqs[start:], one to each
// server of reqUps, as mg lines when meta says so; they are written in
// OnPollEnd. The retrieval waits for them all; it is one request more
// until all are queued, so that those that fail at once (an ejected
// server) do not finish it before.
func (s *loopSlot) send(reqUps []*loopUpstream, start int, meta bool) {
	s.pending = len(reqUps) + 1
	for ri, u := range reqUps {
		r := s.reqs[start+ri]
		r.meta = meta
		s.ask(u, r)
	}
	s.pending--
}

// ask sends a request of the retrieval to u's server: one get or gets
// line, or its keys on the end of the line before it (see joinable), or
// one mg per key.
func (s *loopSlot) ask(u *loopUpstream, r *loopReq) {
	if !u.admit(r) {
		return
	}
	joined := false
	if r.meta {
		for _, i := range r.asked {
			u.out = append(u.out, "mg "...)
			u.out = append(u.out, s.upKey(i)...)
			u.out = append(u.out, " v f t c\r\n"...)
		}
	} else {
		head := u.joinable(s.id, len(r.asked))
		if joined = head != nil; joined {
			// The keys go on the end of head's line.
			u.out = u.out[:len(u.out)-len(crlf)]
			head.joined++
		} else {
			verb := "get"
			if s.id == cmdGets {
				verb = "gets"
			}
			u.out = append(u.out, verb...)
			head, u.joinKeys = r, 0
		}
		for _, i := range r.asked {
			u.out = append(u.out, ' ')
			u.out = append(u.out, s.upKey(i)...)
		}
		u.out = append(u.out, crlf...)
		u.join, u.joinEnd = head, len(u.out)
		if u.joinKeys += len(r.asked); u.joinKeys > loopJoinKeys && head == r {
			u.join = nil // too long to be joined
		}
	}
	u.q.push(r)
	if s.zone == 0 {
		// Counted as the goroutine path counts: its reads of other
		// zones are not.
		u.srv.CountGet(len(r.asked), joined)
	}
}

// store sends a storage command, its value enveloped when the codec or a
// rewritten key asks for it. An append or prepend to an enveloped value
// is a read-modify-write, left to the goroutine path, and so is a value
// over the size limits, which is refused there.
func (lc *loopClient) store(id int, words [][]byte, data []byte, lineLen int) (int, bool) {
	c := lc.c
	a := parseStoreArgs(words, id == cmdCas)
	if !a.argsOK || !lc.validKey(a.key) {
		return 0, false
	}
	join := id == cmdAppend || id == cmdPrepend
	envFlags := a.flags
	if join {
		envFlags = 0 // memcached ignores the flags of append and prepend
	}
	// A value under a rewritten key is always enveloped, bound to the
	// client key: another key may meet it upstream.
	enveloped := c.envelopes(a.key, envFlags) || lc.rewritten(a.key)
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if enveloped && join || a.vlen > limit {
		return 0, false
	}
	total := lineLen + a.vlen + 2
	if len(data) < total {
		if lc.pendable(total, len(data)) {
			// All of data is the request's: it goes to a buffer of its
			// own, and the rest of it is read there.
			var buf []byte
			if total >= loopChunk {
				lc.pendSh = lc.ls.chunk(total)
				buf = lc.pendSh.buf
			} else {
				buf = make([]byte, 0, total)
			}
			lc.pend = append(buf[:0:total], data...)
			return len(data), true
		}
		lc.want = total // from where this request begins, the first once process hands what came before
		return 0, true
	}
	if !bytes.HasSuffix(data[:total], crlf) {
		return 0, false
	}
	// Not counted yet: the request may still be handed over.
	rk := c.lookup(a.key, needTenant|postingsIf(enveloped))
	value, flags := data[lineLen:lineLen+a.vlen], a.flags
	if enveloped {
		value, flags = c.encodeFor(a.key, rk.bound, rk.postings, a.flags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			return 0, false
		}
	}
	c.countRewrite(rk)
	c.p.stats.cmdSet.Add(1)
	tenant := c.p.tenants.counters(rk.tenant)
	if tenant != nil {
		tenant.requests.Add(1)
	}
	w := loopWrite{tenant: tenant, size: len(value), enveloped: enveloped, logical: a.vlen}
	lc.command(id, rk.up, a.noreply, w, func(out []byte, _ uint32) []byte {
		out = appendStorage(out, storageVerbs[id], string(rk.up), flags, a.exptime, len(value), a.cas, id == cmdCas)
		out = append(out, value...)
		return append(out, crlf...)
	})
	return total, true
}

// zoneByZone reports whether write id tries the zones in turn (see
// decide) rather than going to every zone at once: every write with
// --zone-writes=local, and with --zone-writes=all the writes that take
// only where the item is as the client expects it (replace, cas, append,
// prepend, incr, decr), after which the other zones are brought in line
// (see align).
func (p *Proxy) zoneByZone(id int) bool {
	if len(p.zones) == 1 {
		return false
	}
	if p.cfg.ZoneWrites == zoneWritesLocal {
		return true
	}
	switch id {
	case cmdReplace, cmdCas, cmdAppend, cmdPrepend, cmdIncr, cmdDecr:
		return true
	}
	return false
}

// keyVerbs names the commands of one key and no data sent upstream as they
// are; incr and decr go as meta arithmetic (wire.AppendArith).
var keyVerbs = [numCommands]string{cmdDelete: "delete ", cmdTouch: "touch "}

// keyCommand sends a delete, touch, incr or decr, in the forms memcached
// takes; any other is left to the goroutine path, which answers it as
// memcached does.
func (lc *loopClient) keyCommand(id int, w [][]byte) bool {
	key := w[1]
	noreply := bytes.Equal(w[len(w)-1], noreplyWord)
	var arg []byte
	var delta uint64
	switch id {
	case cmdDelete:
		holdZero := len(w) > 2 && bytes.Equal(w[2], []byte("0"))
		if !(len(w) == 2 || len(w) == 3 && (holdZero || noreply) || len(w) == 4 && holdZero && noreply) {
			return false
		}
	case cmdTouch:
		exptime, ok := wire.ParseInt32(w[2])
		if !ok || len(w) == 4 && !noreply {
			return false
		}
		arg = strconv.AppendInt(lc.c.scratch[:0], int64(exptime), 10)
		lc.c.scratch = arg
	case cmdIncr, cmdDecr:
		// The number of an enveloped value is changed by a
		// read-modify-write, on the goroutine path.
		var ok bool
		if delta, ok = wire.ParseUint64(w[2]); !ok || lc.c.envelopes(key, 0) || lc.rewritten(key) {
			return false
		}
	}
	if !lc.validKey(key) {
		return false
	}
	up := lc.c.resolve(key, 0).up
	lc.command(id, up, noreply, loopWrite{}, func(out []byte, tag uint32) []byte {
		if id == cmdIncr || id == cmdDecr {
			return wire.AppendArith(out, id == cmdIncr, up, delta, tag)
		}
		return appendKeyCommand(out, keyVerbs[id], string(up), arg)
	})
	return true
}

// command sends a command of one key whose reply is one line, which build
// appends, to key's server: with zones, in every zone at once, or zone
// after zone (see zoneByZone). A request to an ejected server fails at
// once. A storage command gives what its write counts.
func (lc *loopClient) command(id int, key []byte, noreply bool, w loopWrite, build func(out []byte, tag uint32) []byte) {
	p := lc.c.p
	s := lc.ls.slot(lc, id)
	s.noreply, s.write = noreply, w
	s.ups = append(s.ups[:0], key...)
	lc.slots = append(lc.slots, s)
	lc.c.lastCmd.Store(s.began.UnixNano())
	// The write is marked, and the key's tier entry dropped, before it
	// goes upstream and again once it is answered (see writeGuard).
	p.writingOf(key)
	if p.zoneByZone(id) {
		// The request is kept, in the slot's arena, for the next zone.
		s.pending = 1
		s.arena = build(s.arena[:0], s.tag)
		s.tryZone(0)
		return
	}
	s.pending = len(p.zones)
	var req []byte // the request, as built for the first zone that takes it
	for _, z := range p.zones {
		u := lc.ls.upstreamOf(z.up.Load(), key)
		r := lc.ls.req(s)
		r.store, r.srv, r.expect = true, u.srv, cmdReplies[id]
		s.reqs = append(s.reqs, r)
		if !u.admit(r) {
			continue
		}
		if req == nil {
			start := len(u.out)
			u.out = build(u.out, s.tag)
			req = u.out[start:]
		} else {
			u.out = append(u.out, req...) // another server's buffer
		}
		u.q.push(r)
	}
}

// tryZone sends the kept request of a write tried zone after zone to its
// key's server in zone z. It goes out with the other requests of the
// poll, in OnPollEnd.
func (s *loopSlot) tryZone(z int) {
	ls := s.client.ls
	u := ls.upstreamOf(s.client.c.p.zones[z].up.Load(), s.ups)
	r := ls.req(s)
	r.store, r.srv, r.expect = true, u.srv, cmdReplies[s.id]
	s.reqs = append(s.reqs, r)
	s.zone = z
	if !u.admit(r) {
		return
	}
	u.out = append(u.out, s.arena...)
	u.q.push(r)
}

// decide takes zone s.zone's reply (or err) to a write tried zone after
// zone, as the goroutine path decides it (sendDeciding; sendAdd with
// --zone-writes=local for add). It returns false when it sent the write
// to the next zone; otherwise the reply that answers the client: the
// first zone's that took the write (for add, that answered); when none
// did, the first zone's that answered, EXISTS if one said so; when none
// answered, the local zone's error (for add, the last zone's).
func (s *loopSlot) decide(r *loopReq, reply []byte, err error) (answer []byte, decided bool, _ error) {
	p := s.client.c.p
	z := s.zone
	r.err, r.buf = err, append(r.buf[:0], reply...)
	if s.id == cmdAdd {
		if err == nil {
			return r.buf, true, nil
		}
		p.zones[z].writeFailures.Add(1)
	} else {
		if writeFailed(reply, err) {
			p.zones[z].writeFailures.Add(1)
		}
		if err == nil {
			switch replyOutcome(reply) {
			case outcomeStored, outcomeOK, outcomeClientError, outcomeUpstreamError:
				return r.buf, true, nil
			}
		}
	}
	if z+1 < len(p.zones) {
		s.tryZone(z + 1)
		return nil, false, nil
	}
	if s.id == cmdAdd {
		return r.buf, true, r.err
	}
	var first *loopReq
	for _, q := range s.reqs {
		if q.err == nil && (first == nil || replyOutcome(q.buf) == outcomeExists && replyOutcome(first.buf) != outcomeExists) {
			first = q
		}
	}
	if first == nil {
		return nil, true, s.reqs[0].err
	}
	return first.buf, true, nil
}

// addHeld settles an add sent to every zone, which stores only if no
// zone held the key: when one did, the copies the add made in the others
// are deleted (they will be filled from that zone), and that zone's
// NOT_STORED answers. Otherwise reply does.
func (s *loopSlot) addHeld(reply []byte) []byte {
	held := slices.IndexFunc(s.reqs, func(q *loopReq) bool {
		return q.err == nil && replyOutcome(q.buf) == outcomeNotStored
	})
	if held < 0 {
		return reply
	}
	s.keys = appendKeyCommand(s.keys[:0], "delete ", string(s.ups), nil)
	for z, q := range s.reqs {
		if q.err == nil && replyOutcome(q.buf) == outcomeStored {
			s.alignZone(z, s.keys, false)
		}
	}
	return s.reqs[held].buf
}

// align brings the key in every zone but the deciding one, s.zone, in
// line after a write there took (with --zone-writes=all): a replace or
// cas is followed by a set of the value stored; an append, prepend,
// incr or decr, which changed the value in place, by a delete, as the
// other copies cannot be brought to the same bytes without reading it.
func (s *loopSlot) align(reply []byte) {
	var req []byte
	switch oc := replyOutcome(reply); {
	case (s.id == cmdReplace || s.id == cmdCas) && oc == outcomeStored:
		// The kept request, "<verb> <key> <flags> <exptime> <bytes>[ <cas>]"
		// and the value, as a set.
		line, value, _ := bytes.Cut(s.arena, crlf)
		words := bytes.Fields(line)
		req = append(s.keys[:0], "set"...)
		for _, w := range words[1:5] {
			req = append(append(req, ' '), w...)
		}
		req = append(append(req, crlf...), value...)
	case (s.id == cmdAppend || s.id == cmdPrepend) && oc == outcomeStored, (s.id == cmdIncr || s.id == cmdDecr) && oc == outcomeOK:
		req = appendKeyCommand(s.keys[:0], "delete ", string(s.ups), nil)
	default:
		return
	}
	s.keys = req
	for z := range s.client.c.p.zones {
		if z != s.zone {
			s.alignZone(z, req, true)
		}
	}
}

// alignZone sends req to the key's server in zone z, and drops its reply,
// counting a failure against the zone when count says so. The slot's
// reply waits for it, as on the goroutine path: a client told a write
// took finds no older copy in any zone.
func (s *loopSlot) alignZone(z int, req []byte, count bool) {
	u := s.client.ls.upstreamOf(s.client.c.p.zones[z].up.Load(), s.ups)
	kind := uint8(dropUndo)
	if count {
		kind = dropAlign
	}
	if u.queueDropped(s, kind, z, wire.ReplyOf(req)) {
		u.out = append(u.out, req...)
	}
}

// queueDropped queues on u a request whose reply is dropped, of kind
// drop (about zone), whose bytes the caller appends to u.out and whose
// reply is of family expect. When s is
// not nil, s's reply waits for it. It reports false when the server is
// ejected: the request failed at once, counted as its kind counts a
// failure.
func (u *loopUpstream) queueDropped(s *loopSlot, drop uint8, zone int, expect wire.Reply) bool {
	return u.pushDropped(s, u.dropReq(drop, zone, expect))
}

// dropReq returns a request whose reply is dropped, of kind drop (about
// zone) whose reply is of family expect, for pushDropped.
func (u *loopUpstream) dropReq(drop uint8, zone int, expect wire.Reply) *loopReq {
	r := take(&u.ls.reqs)
	r.srv, r.store, r.drop, r.zone, r.began, r.expect = u.srv, true, drop, zone, u.ls.now, expect
	return r
}

// pushDropped is queueDropped for a request dropReq made.
func (u *loopUpstream) pushDropped(s *loopSlot, r *loopReq) bool {
	ls := u.ls
	if err := u.srv.Admit(); err != nil {
		u.srv.Observe(ls.now, err)
		ls.l.p.countDropped(r, nil, err)
		ls.putReq(r)
		return false
	}
	if s != nil {
		r.slot = s
		s.pending++
	}
	u.q.push(r)
	return true
}

// admit reports whether r may go to the server; a request to an ejected
// server fails at once, counted as ejected, not as sent.
func (u *loopUpstream) admit(r *loopReq) bool {
	err := u.srv.Admit()
	if err != nil {
		u.srv.Observe(r.began, err)
		r.done(nil, err)
	}
	return err == nil
}

// upstreamOf returns the loop's connection to the server of upstream key
// key in the set up.
func (ls *loopState) upstreamOf(up *upstream.Set, key []byte) *loopUpstream {
	return ls.upstream(up.Servers[up.PickBytes(key, ls.l.p.cfg.EjectRehash)])
}

// upstream returns the loop's connection to srv, made when first needed.
func (ls *loopState) upstream(srv *upstream.Server) *loopUpstream {
	u := ls.ups[srv]
	if u == nil {
		u = &loopUpstream{ls: ls, srv: srv}
		ls.ups[srv] = u
		ls.upList = append(ls.upList, u)
	}
	return u
}

// loopMaxBatches is how many batches a connection has in flight at most:
// what the loop reads while that many are out waits for the first reply,
// and goes out with what it read meanwhile, in one write. Two keep
// memcached busy (it has the next batch when it has answered one) at
// fewer writes than a write per poll.
const loopMaxBatches = 2

// flush writes the requests waiting as one batch, dialling first if the
// loop has no connection to the server. A batch already in flight does not
// hold it back: the connection is a pipeline, as twemproxy's are, and a
// request waits for no earlier batch's round trip to begin its own
// (replies still come back in order). Only loopMaxBatches in flight do.
func (u *loopUpstream) flush() {
	if u.q.len() == u.sent {
		return
	}
	if u.gc == nil {
		u.dial()
		return
	}
	if u.batches >= loopMaxBatches {
		return
	}
	u.batches++
	batch := u.q.all()[u.sent:]
	for _, r := range batch {
		r.began = u.ls.now // the upstream timeout runs from here
	}
	batch[len(batch)-1].ends = true
	u.sent = u.q.len()
	u.join = nil
	// A write error closes the connection there and then, and OnClose
	// fails every request queued; what answering them queues on u goes
	// into a buffer of its own, which must not be cleared here.
	out := u.out
	u.out = nil
	if u.tls == nil {
		u.gc.Write(out)
	} else if err := u.tls.write(u.gc, out); err != nil {
		u.abort(err)
	}
	if len(u.out) == 0 {
		u.out = out[:0]
	}
}

func (u *loopUpstream) dial() {
	if u.dialing {
		return
	}
	u.dialing = true
	el := u.ls.el
	go func() {
		d := &loopDialed{u: u}
		nc, tc, err := u.srv.DialLoop(context.Background(), func(nc net.Conn) net.Conn {
			d.tls = &loopTLS{b: &tlsBridge{Conn: nc}}
			return d.tls.b
		})
		if tc != nil {
			d.tls.conn, d.tls.w, d.tls.b.loop = tc, upstream.RequestRecords(tc), true
		}
		if err == nil {
			_, err = el.Enroll(nc, d) // closes nc
		}
		if err != nil {
			el.Execute(func() {
				u.ls.clock()
				u.dialing = false
				u.fail(err)
			})
		}
	}()
}

// loopDialed is a new upstream connection on its way to the loop.
type loopDialed struct {
	u   *loopUpstream
	tls *loopTLS
}

// abort closes the connection on err and fails what is queued.
func (u *loopUpstream) abort(err error) {
	if gc := u.gc; gc != nil {
		u.gc, u.tls = nil, nil
		gc.Close()
	}
	u.fail(err)
}

// fail answers every queued request with err, counted once against the
// server.
func (u *loopUpstream) fail(err error) {
	if u.q.len() == 0 {
		u.dropChunk()
		return
	}
	u.srv.Record(u.q.front().began, err)
	q := u.q.all()
	u.q, u.sent, u.out = reqQueue{}, 0, u.out[:0] // what answering q queues goes to a new array
	u.join, u.batchErr, u.batches = nil, nil, 0
	u.dropChunk()
	for _, r := range q {
		if r.drop > 0 {
			u.ls.l.p.countDropped(r, nil, err)
			u.dropped(r)
		} else {
			r.done(nil, err)
		}
	}
}

// countDropped counts the reply (or err) of a request whose reply is
// dropped, as the goroutine path counts its kind.
func (p *Proxy) countDropped(r *loopReq, reply []byte, err error) {
	switch r.drop {
	case dropCorrupt:
		if err == nil && bytes.Equal(reply, replyDeleted) {
			p.stats.codecDeleted.Add(1)
		}
	case dropFill:
		result := fillNotStored
		switch {
		case err != nil:
			result = fillFailed
		case bytes.Equal(reply, replyStored):
			result = fillStored
		}
		if mayHaveStored(result) && p.wroteSinceOf(r.key, r.gen) {
			r.undo, result = true, fillDropped // see dropped
		}
		p.fills[result].Add(1)
	case dropUnfill:
		p.wroteOf(r.key)
		if err == nil && isServerError(reply) {
			r.srv.CountServerError()
		}
	case dropAlign, dropUndo:
		if err == nil && isServerError(reply) {
			r.srv.CountServerError()
		}
		if r.drop == dropAlign && writeFailed(reply, err) {
			p.zones[r.zone].writeFailures.Add(1)
		}
	}
}

// dropped gives back a request whose reply nobody reads, and lets the
// reply it held back go. A fill that a write raced is deleted again.
func (u *loopUpstream) dropped(r *loopReq) {
	s := r.slot
	if r.undo {
		u.unfill(r.key)
	}
	u.ls.putReq(r)
	if s != nil {
		s.release()
	}
}

// release ends one thing the slot's made reply waits for (a request whose
// reply is dropped, or the making of the reply itself), and writes the
// replies that are ready once nothing is left.
func (s *loopSlot) release() {
	if s.pending--; s.pending == 0 {
		s.client.written()
	}
}

// replies reads the replies that have arrived and answers their requests,
// in order.
func (u *loopUpstream) replies() {
	gc, t := u.gc, u.tls
	var readErr error // the end of a TLS session, after the replies in it
	if t != nil {
		readErr = t.read(gc)
		if t.send(gc); u.gc != gc {
			return // the write of TLS's own answer failed
		}
	}
	data := unhandled(gc, t)
	off := 0
	for u.sent > 0 && off < len(data) {
		r := u.q.front()
		u.takeChunk(0, 0)
		n, whole, bad := u.scan.feed(data[off:], r)
		u.adopt()
		off += n
		if bad != nil {
			u.outOfStep(bad)
			return
		}
		if !whole {
			break
		}
		reply, vals := u.scan.acc, u.scan.vals
		reply, err, bad := u.checkReply(r, reply, vals)
		if bad != nil {
			u.outOfStep(bad)
			return
		}
		u.q.pop()
		u.sent--
		ends := r.ends
		// The requests that share r's get line share its reply.
		joined := append(u.joined[:0], r)
		for range r.joined {
			q := u.q.front()
			joined = append(joined, q)
			ends = ends || q.ends
			u.q.pop()
			u.sent--
		}
		u.joined = joined // its array serves the next reply
		if !r.store && !r.meta && len(r.asked) <= loopJoinKeys {
			// A mean over about the last eight replies to requests
			// that may join a line.
			u.replyMean += (len(reply)/len(joined) - u.replyMean) / 8
		}
		if err != nil && u.batchErr == nil {
			u.batchErr = err
		}
		if ends {
			// A batch counts once in the server's requests, as on the
			// goroutine path, with the first error a reply in it was.
			u.srv.Record(r.began, u.batchErr)
			u.batchErr = nil
			u.batches--
		}
		// The next reply begins where this one ends, in the same chunk.
		u.scan.next()
		switch {
		case err != nil:
			for _, q := range joined {
				q.done(nil, err)
			}
		case r.drop > 0:
			u.ls.l.p.countDropped(r, reply, nil)
			u.dropped(r)
		case r.store:
			r.done(reply, nil) // which copies what it keeps
		case r.meta:
			u.chunk.refs++
			r.share = u.chunk
			r.done(reply[:len(reply):len(reply)], nil)
		default:
			u.chunk.refs += len(joined)
			u.ls.answerJoined(joined, u.chunk, reply, vals)
		}
		clear(joined)
		if u.gc != gc {
			// A flush made while answering found the connection broken:
			// evloop closed it there, and OnClose failed what was queued.
			// What was queued since goes out on a new one.
			u.flush()
			return
		}
	}
	handle(gc, t, off)
	if len(u.scan.acc) == 0 {
		u.dropChunk() // no reply is being read: the next read takes one again
	}
	if readErr != nil {
		u.abort(readErr)
		return
	}
	// What answering queued goes out in OnPollEnd.
}

// Reading replies into chunks: each read of a connection goes into the
// chunk its reply is gathered in, after the bytes of it read before, and
// a reply a client is owed stays where it was read, referring to its
// chunk (loopReq.share) until it is written. The bytes of a reply are
// copied only when its chunk has too little room left for the next read:
// what is read of it so far moves to a new chunk.

// loopChunk is the size of a chunk, and loopChunkRoom the least room a
// read is given in one. Measured on the comparison's load 3 (100-key gets
// of 3 KiB values over four servers), 512 KiB chunks took 10 % fewer reads
// than 256 KiB ones and moved fewer replies; 1 MiB ones did no better.
const (
	loopChunk     = 512 << 10
	loopChunkRoom = 32 << 10
)

// takeChunk has the connection read into a chunk with room for at least n
// more bytes, taking one when it has none. A reply that has to move goes
// to a chunk of at least size bytes, and of twice what it has so far, so
// that a long reply, of many values, moves a few times, not once a read.
func (u *loopUpstream) takeChunk(n, size int) {
	acc := u.scan.acc
	if u.chunk != nil && cap(acc)-len(acc) >= n {
		return
	}
	size = max(size, len(acc)+n, 2*len(acc))
	if u.chunk == nil {
		u.chunk = u.ls.chunk(size)
		u.scan.acc = u.chunk.buf[:0]
		return
	}
	u.moveTo(size)
}

// moveTo moves what is read of the reply being read to a chunk of at
// least size bytes.
func (u *loopUpstream) moveTo(size int) {
	acc := u.scan.acc
	sh := u.ls.chunk(size)
	u.scan.acc = append(sh.buf[:0], acc...)
	u.ls.release(u.chunk)
	u.chunk = sh
}

// adopt makes a larger array the reply being read moved to (appended to
// past the end of its chunk, or grown for a long value) the connection's
// chunk.
func (u *loopUpstream) adopt() {
	acc, buf := u.scan.acc, u.chunk.buf
	if _, ok := within(acc[:cap(acc)], buf[:cap(buf)]); ok {
		return // still in the chunk
	}
	u.ls.release(u.chunk)
	u.chunk = take(&u.ls.shares)
	u.chunk.buf, u.chunk.refs = acc[:0], 1
}

// dropChunk gives up the connection's hold on its chunk, and the reply
// being read.
func (u *loopUpstream) dropChunk() {
	if u.chunk != nil {
		u.ls.release(u.chunk)
		u.chunk = nil
	}
	u.scan = replyScan{vals: u.scan.spare()}
}

// room returns where the connection's next read goes: the rest of its
// chunk, at least loopChunkRoom bytes, and for a long value, as much of
// it as one read straight into place takes (replyScan.direct), with
// loopChunkRoom after it, so that the bytes after the value do not move
// it. A reply moved for a long value moves to a chunk with room for all
// of the value, up to the largest chunk the loop keeps: memory follows
// what arrives, not what a reply says will.
func (u *loopUpstream) room() []byte {
	want, size := loopChunkRoom, 0
	if len(u.scan.acc) == 0 && u.sent > 0 {
		// A reply begins: room for as long a one as they have been, so
		// that a long one is read whole where it begins, not moved; no
		// more than a chunk the loop keeps, so that a short reply after
		// long ones does not take an array of their size for itself.
		want = max(want, min(u.replyMean+u.replyMean/4, loopChunkKeepMax))
	}
	n := u.scan.direct()
	if n > 0 {
		want = n + loopChunkRoom
		size = len(u.scan.acc) + min(u.scan.need, loopChunkKeepMax) + loopChunkRoom
	}
	u.takeChunk(want, size)
	acc := u.scan.acc
	if n == 0 {
		return acc[len(acc):cap(acc)]
	}
	u.ls.l.p.stats.upstreamReadsInPlace.Add(1)
	return acc[len(acc) : len(acc)+n]
}

// answerJoined answers the requests that shared one get line (or the one
// that had a line of its own) from its reply, whose VALUE lines are vals,
// in chunk sh, which holds a reference for each of them: memcached
// answers the keys of the line in order and skips misses, so each
// request's VALUE blocks are the run of them that match finds for it, and
// the next request's run begins where it stopped.
//
// When two of them name one key and memcached found it only the second
// time (stored in between), the first takes the hit and the second has a
// miss: either order is one the two concurrent requests could have run in.
func (ls *loopState) answerJoined(group []*loopReq, sh *loopShare, reply []byte, vals []valueAt) {
	start := 0
	for _, r := range group {
		n := r.slot.match(r, reply, vals)
		end := start
		if n > 0 {
			end = vals[n-1].end()
		}
		r.share, r.buf = sh, reply[start:end:end]
		start, vals = end, vals[n:]
		r.slot.answered()
	}
}

// done records the reply (or err) of one request. A retrieval's request
// keeps reply, which its owners' blocks point into.
func (r *loopReq) done(reply []byte, err error) {
	s := r.slot
	if r.store {
		s.stored(r, reply, err)
		return
	}
	switch {
	case err != nil:
		r.err = err
		for _, i := range r.asked {
			s.owners[i].err = err
		}
	default:
		// A meta request's reply: a get's are matched to their
		// requests by answerJoined.
		r.buf = reply
		s.matchMeta(r)
	}
	s.answered()
}

// answered ends one request of a retrieval, and answers the retrieval
// once none is left.
func (s *loopSlot) answered() {
	if s.pending--; s.pending == 0 {
		s.finish()
	}
}

// finish answers a retrieval whose requests are all in, once no other zone
// is left to ask for the keys not found, and fills the local zone with
// what the others had.
func (s *loopSlot) finish() {
	for s.askNextZone() {
		if s.pending > 0 {
			return
		}
	}
	// Until the reply is made: answer may queue the delete of a damaged
	// item, which the reply waits for.
	s.pending = 1
	s.answer()
	s.client.made(s)
	// Only what the client got as a hit is filled: answer made a refused
	// envelope a miss. The fill goes upstream in OnPollEnd, after the
	// client's reply is written: it costs the client no time.
	s.fill()
	s.release()
}

// stored answers a command of one key with memcached's reply line, or
// err. Sent to every zone, it is answered by the local zone's reply, or
// when that failed, by the first zone's that answered.
func (s *loopSlot) stored(r *loopReq, reply []byte, err error) {
	p := s.client.c.p
	st := p.stats
	if err == nil && isServerError(reply) {
		r.srv.CountServerError()
	}
	switch {
	case p.zoneByZone(s.id):
		var decided bool
		if reply, decided, err = s.decide(r, reply, err); !decided {
			return
		}
		if err == nil && p.cfg.ZoneWrites != zoneWritesLocal {
			s.align(reply)
		}
	case len(p.zones) > 1:
		// s.reqs fills as the command is sent: one request per zone, in
		// order, once all are in.
		r.err, r.buf = err, append(r.buf[:0], reply...)
		if s.pending--; s.pending > 0 {
			return
		}
		s.pending = 1 // until the reply is made: addHeld may queue deletes it waits for
		answer := s.reqs[0]
		for _, q := range s.reqs {
			if q.err == nil {
				answer = q
				break
			}
		}
		for z, q := range s.reqs {
			if writeFailed(q.buf, q.err) {
				p.zones[z].writeFailures.Add(1)
			}
		}
		reply, err = answer.buf, answer.err
		if s.id == cmdAdd && err == nil {
			reply = s.addHeld(reply)
		}
	}
	p.wroteOf(s.ups)
	if err != nil {
		line, oc := upstreamReply(err)
		st.record(s.id, oc)
		s.out = append(s.out, line)
	} else {
		oc := replyOutcome(reply)
		st.record(s.id, oc)
		if w := s.write; oc == outcomeStored {
			if w.enveloped {
				s.client.c.countStored(w.logical, w.size)
			}
			if w.tenant != nil {
				w.tenant.written.Add(uint64(w.size))
			}
		}
		s.line = append(s.line[:0], reply...)
		s.out = append(s.out, s.line)
	}
	// The reply goes once the writes bringing other zones in line are
	// answered too (see alignZone).
	s.release()
}

// match points each asked key of r at its VALUE block in reply, whose
// VALUE lines, from r's first on, are vals: memcached answers hits in the
// order the keys were asked and skips misses. A reply that is not a
// retrieval's (an error line) has none, and leaves every key a miss. It
// returns how many of vals are r's: in a reply to a joined line, the
// blocks of the requests after r follow.
func (s *loopSlot) match(r *loopReq, reply []byte, vals []valueAt) int {
	k := 0
	for n := range vals {
		v := &vals[n]
		key := v.keyIn(reply)
		for k < len(r.asked) && !bytes.Equal(s.upKey(r.asked[k]), key) {
			k++
		}
		if k == len(r.asked) {
			return n
		}
		o := &s.owners[r.asked[k]]
		o.block, o.flags, o.size, o.cas, o.hasCAS = v.block(reply), v.flags, v.size, v.cas, v.hasCAS
		k++
	}
	return len(vals)
}

// matchMeta points each asked key of r, a request of one mg per key, at
// its reply: "VA …" and the value for a hit, EN for a miss, and an error
// line for a key the server failed.
func (s *loopSlot) matchMeta(r *loopReq) {
	b := r.buf
	for _, i := range r.asked {
		o := &s.owners[i]
		j := bytes.IndexByte(b, '\n')
		line := b[:j+1]
		if !bytes.HasPrefix(line, metaValue) {
			if !bytes.Equal(line, metaMiss) {
				o.err = fmt.Errorf("mg: memcached replied: %q", line)
			}
			b = b[j+1:]
			continue
		}
		size, it, err := upstream.ParseMetaValue(line) // replyScan read it: no error
		if err != nil {
			o.err = err
			return
		}
		end := j + 1 + size + 2
		o.block, o.flags, o.size, o.cas, o.hasCAS, o.ttl, o.meta = b[:end:end], it.Flags, size, it.CAS, true, it.TTL, true
		b = b[end:]
	}
}

// askNextZone asks the next zone for the keys that the zones asked so far
// did not answer: misses, and keys whose server failed or is ejected,
// with one mg per key (which tells the time to live a fill needs), in one
// request per server. It counts the keys asked of the zone before, and
// reports whether it asked another.
func (s *loopSlot) askNextZone() bool {
	p := s.client.c.p
	if len(p.zones) == 1 {
		return false
	}
	s.countZoneReads()
	z := s.zone + 1
	if z == len(p.zones) {
		return false
	}
	ls := s.client.ls
	up := p.zones[z].up.Load()
	start := len(s.reqs)
	var ups [4]*loopUpstream
	reqUps := ups[:0]
	for i := range s.owners {
		o := &s.owners[i]
		if o.first != 0 || o.block != nil || o.inTier {
			continue
		}
		key := s.upKey(i)
		reqUps = s.group(reqUps, start, ls.upstreamOf(up, key), i)
		o.zone, o.err = z, nil
		o.gen = p.writeCountOf(key) // for its fill
	}
	if len(reqUps) == 0 {
		return false
	}
	s.zone, s.zoneStart = z, start
	s.send(reqUps, start, true)
	return true
}

// countZoneReads counts the keys asked of the zone asked last, by result.
func (s *loopSlot) countZoneReads() {
	zone := s.client.c.p.zones[s.zone]
	var hits, misses, errs, size uint64
	for _, r := range s.reqs[s.zoneStart:] {
		for _, i := range r.asked {
			switch o := &s.owners[i]; {
			case o.err != nil:
				errs++
			case o.block != nil:
				hits++
				size += uint64(o.size)
			default:
				misses++
			}
		}
	}
	zone.reads[zoneHit].Add(hits)
	zone.reads[zoneMiss].Add(misses)
	zone.reads[zoneError].Add(errs)
	zone.readBytes.Add(size)
}

// fill stores the hits that other zones answered into the local zone, as
// memcached holds them (envelopes included), with an add and their
// remaining time to live: a value the local zone got meanwhile is newer,
// and stays. The adds go out in OnPollEnd. A fill that a write to its key
// through the sidecar raced is not sent, or deleted again (see
// writeGuard).
func (s *loopSlot) fill() {
	p := s.client.c.p
	if s.zone == 0 || !p.cfg.ZoneFill {
		return
	}
	ls := s.client.ls
	up := p.zones[0].up.Load()
	for i := range s.owners {
		o := &s.owners[i]
		if o.first != 0 || o.zone == 0 || o.block == nil || o.ttl == 0 {
			continue // a key gone in under a second is not worth it
		}
		key := s.upKey(i)
		if p.wroteSinceOf(key, o.gen) {
			p.fills[fillDropped].Add(1)
			continue
		}
		u := ls.upstreamOf(up, key)
		r := u.dropReq(dropFill, 0, wire.ReplyStorage)
		r.key, r.gen = append(r.key, key...), o.gen
		if !u.pushDropped(nil, r) {
			continue
		}
		u.out = appendStorage(u.out, "add", string(key), o.flags, int32(wire.ExptimeOf(o.ttl)), o.size, 0, false)
		u.out = append(append(u.out, o.stored()...), crlf...)
	}
}

// answer builds a retrieval's reply once every request is in.
func (s *loopSlot) answer() {
	p := s.client.c.p
	st := p.stats
	oc := outcomeOK
	for i := range s.owners {
		o := &s.owners[i]
		if o.first != 0 || o.err == nil {
			continue
		}
		// A key whose last zone asked failed was not answered.
		if p.cfg.RetrievalFailure == failureError {
			line, _ := upstreamReply(o.err)
			st.record(s.id, outcomeUpstreamError)
			s.out = append(s.out, line)
			return
		}
		oc = outcomeUpstreamError // the failed requests' keys are misses
		break
	}
	// Blocks that are rewritten go into the slot's arena, which may move
	// as it grows: they are pointed at once all are in.
	for i := range s.owners {
		o := &s.owners[i]
		if o.first == 0 && o.block != nil && (o.meta || o.bound || p.codec != nil && p.codec.IsEnveloped(o.flags) || o.hasCAS && s.id == cmdGet) {
			if !s.open(i, o) {
				o.block = nil
			}
		}
	}
	var tally keyTally
	for i := range s.owners {
		o := &s.owners[i]
		src := o // the owner whose block answers: the same key named earlier, or o
		if o.first > 0 {
			src = &s.owners[o.first-1]
		}
		block := src.block // o.block stays memcached's, which a fill stores
		if src.arenaEnd > 0 {
			block = s.arena[src.arenaStart:src.arenaEnd:src.arenaEnd]
		}
		hit := block != nil
		if hit {
			s.out = append(s.out, block)
		}
		tally.add(o.tenant, hit)
	}
	tally.flush(st)
	st.record(s.id, oc)
	s.out = append(s.out, replyEnd)
}

// open replaces an enveloped hit's block with the value it carries, and
// reports whether it is still a hit: a refused envelope is a miss, and a
// damaged one is deleted when --codec-delete-corrupt asks for it.
func (s *loopSlot) open(i int, o *loopOwner) bool {
	p := s.client.c.p
	key := s.key(i)
	stored := o.stored()
	if o.bound && !p.codec.IsEnveloped(o.flags) {
		// Under a rewritten key, a plain item is some client's own value
		// at an equal key: a miss.
		p.stats.keyUnbound.Add(1)
		return false
	}
	if p.codec == nil || !p.codec.IsEnveloped(o.flags) {
		// A plain value whose header names a CAS the client's get did
		// not ask for, or an mg reply.
		s.inArena(o, key, o.flags, stored, o.cas, s.id == cmdGets)
		s.keep(i, o, key, o.flags, stored)
		return true
	}
	ls := s.client.ls
	v, flags, err := p.codec.AppendDecode(ls.dec[:0], key, o.bound, o.flags, stored)
	if err != nil {
		r := codec.ReasonOf(err)
		p.stats.codecRefused[r&15].Add(1)
		if r.Damaged() && p.cfg.Codec.DeleteCorrupt {
			s.deleteCorrupt(o.zone, s.upKey(i))
		}
		return false
	}
	ls.dec = v
	p.stats.codecReadLogical.Add(uint64(len(v)))
	p.stats.codecReadStored.Add(uint64(len(stored)))
	s.inArena(o, key, flags, v, o.cas, s.id == cmdGets)
	s.keep(i, o, key, flags, v)
	return true
}

// keep puts the i-th key's hit, asked with mg, into the local tier, when
// the tier is on.
func (s *loopSlot) keep(i int, o *loopOwner, key []byte, flags uint32, v []byte) {
	p := s.client.c.p
	if p.tier != nil && o.meta {
		p.keep(key, string(s.upKey(i)), o.gen, o.immutable, s.began.UnixNano(), v, flags, o.ttl)
	}
}

// inArena writes o's VALUE block anew into the slot's arena.
func (s *loopSlot) inArena(o *loopOwner, key []byte, flags uint32, v []byte, cas uint64, withCAS bool) {
	o.arenaStart = len(s.arena)
	s.arena = appendValueHeader(s.arena, string(key), flags, len(v), cas, withCAS)
	s.arena = append(s.arena, v...)
	s.arena = append(s.arena, crlf...)
	o.arenaEnd = len(s.arena)
}

// deleteCorrupt deletes a damaged item, at its upstream key, in the zone
// it was found in. The retrieval's reply waits for the delete's, as on the
// goroutine path, so that a client that saw the miss never finds the item
// still there.
func (s *loopSlot) deleteCorrupt(zone int, key []byte) {
	lc := s.client
	u := lc.ls.upstreamOf(lc.c.p.zones[zone].up.Load(), key)
	if !u.queueDropped(s, dropCorrupt, zone, wire.ReplyDelete) {
		return // its server is ejected
	}
	u.out = append(u.out, "delete "...)
	u.out = append(u.out, key...)
	u.out = append(u.out, crlf...)
}

// written writes the client's replies that are ready, in order, and hands
// the connection over once nothing is owed when that was asked.
func (lc *loopClient) written() {
	if lc.inProcess || lc.writing {
		// process writes what is ready when it ends; a write that
		// closes the connection calls back in here through closed(),
		// and the loop below goes on with the connection closed.
		return
	}
	st := lc.c.p.stats
	n := 0
	lc.writing = true
	for n < len(lc.slots) && lc.slots[n].pending == 0 {
		s := lc.slots[n]
		if !s.noreply && lc.full() {
			lc.hold()
			for _, s := range lc.slots[n:] {
				if s.pending == 0 {
					lc.ls.detach(s, s.out)
				}
			}
			break
		}
		st.latency[s.id].Observe(lc.ls.now.Sub(s.began).Seconds())
		rest := s.out
		if !s.noreply && lc.gc != nil && !lc.ls.l.abandon.Load() {
			rest = lc.send(s.out)
		}
		lc.charge(s, 0) // given to the socket, to evloop, or to the goroutine path
		if lc.hand != nil && !s.noreply && len(rest) > 0 {
			rest = slices.Clone(rest)
			lc.ls.detach(s, rest)
			lc.hand.replies <- rest // the goroutine writes it; its buffers go with it
		} else {
			lc.ls.putSlot(s)
		}
		lc.slots[n] = nil
		n++
	}
	lc.writing = false
	lc.noteOut()
	if n == 0 {
		return
	}
	lc.slots = append(lc.slots[:0], lc.slots[n:]...)
	lc.last = lc.ls.now
	if len(lc.slots) > 0 {
		return
	}
	if lc.hand != nil {
		close(lc.hand.replies)
		lc.hand = nil
		return
	}
	if lc.gc == nil {
		return
	}
	if lc.handoff || (lc.c.p.draining() && lc.buffered() == 0) {
		// A connection is not closed inside its own OnTraffic:
		// traffic closes it by its return. A draining proxy answers the
		// requests it has read first.
		if !lc.inTraffic && (lc.handoff && lc.movable() || lc.gc.OutboundBuffered() == 0) {
			lc.gc.Close()
		}
		return
	}
	if lc.buffered() > 0 {
		lc.processHeld() // requests held back while too many replies were owed
	}
}

// replyScan reads one upstream reply at a time into acc: a retrieval's
// VALUE blocks up to END, the replies to a request's mg lines, or one
// line.
type replyScan struct {
	acc  []byte
	line int // where the line being read starts in acc
	need int // bytes of a value still to come, with their CRLF
	mg   int // replies to mg lines read whole
	// vals are the VALUE lines of a retrieval's reply read so far. The
	// array serves the next reply (see spare): what the last one held
	// stays valid until the next feed.
	vals []valueAt
}

// valueAt is one VALUE line of a reply as the scan read it: where it
// begins in the reply, how long it and its key are, and what else it
// says, so that matching the reply to its keys does not parse it again.
// It holds offsets, not slices: the reply may move to a larger chunk as
// it grows.
type valueAt struct {
	at, line, key int
	flags         uint32
	size          int
	cas           uint64
	hasCAS        bool
}

// keyIn returns the line's key in reply.
func (v *valueAt) keyIn(reply []byte) []byte {
	return reply[v.at+len(replyValue) : v.at+len(replyValue)+v.key]
}

// end returns where the line's VALUE block (the line, the value and its
// CRLF) ends in the reply.
func (v *valueAt) end() int { return v.at + v.line + v.size + 2 }

// block returns the line's VALUE block in reply.
func (v *valueAt) block(reply []byte) []byte {
	end := v.end()
	return reply[v.at:end:end]
}

// next starts the next reply where the one read ends.
func (r *replyScan) next() {
	*r = replyScan{acc: r.acc[len(r.acc):], vals: r.spare()}
}

// loopValsKeep is the most VALUE lines whose array a scan keeps for the
// next reply.
const loopValsKeep = 1024

// spare returns vals emptied, for the next reply, unless it grew past
// loopValsKeep.
func (r *replyScan) spare() []valueAt {
	if cap(r.vals) > loopValsKeep {
		return nil
	}
	return r.vals[:0]
}

// loopDirectMin is the least of a value still to come that the loop reads
// straight into the buffer its reply is gathered in, rather than into
// evloop's read buffer, from which it would copy it; loopDirectMax the most
// one read takes so. Below evloop's own read size, reading only the value
// would take more reads when replies come back to back.
const (
	loopDirectMin = loopReadBuffer
	loopDirectMax = 4 * loopReadBuffer
)

// direct returns how many bytes of a long value the next read takes
// straight into place, or 0 while no long value is being read.
func (r *replyScan) direct() int {
	if r.need < loopDirectMin {
		return 0
	}
	return min(r.need, loopDirectMax)
}

// inPlace reports whether data begins where acc ends: read there by room.
func (r *replyScan) inPlace(data []byte) bool {
	n := len(r.acc)
	return len(data) > 0 && cap(r.acc) > n && &r.acc[:n+1][n] == &data[0]
}

// feed takes bytes of req's reply from data. It returns how many it took,
// whether the reply is whole, and, when it breaks the protocol, why.
func (r *replyScan) feed(data []byte, req *loopReq) (took int, whole bool, bad *upstream.OutOfStepError) {
	retrieval := !req.store
	for took < len(data) {
		if r.need > 0 {
			n := min(r.need, len(data)-took)
			if r.inPlace(data[took:]) {
				r.acc = r.acc[:len(r.acc)+n] // read into place (room)
			} else {
				r.acc = append(r.acc, data[took:took+n]...)
			}
			took += n
			if r.need -= n; r.need > 0 {
				return took, false, nil
			}
			if !bytes.HasSuffix(r.acc, crlf) {
				return took, false, upstream.OutOfStep(upstream.ReasonMalformed, r.acc[len(r.acc)-2:])
			}
			r.line = len(r.acc)
			if req.store {
				return took, true, nil // an incr's number
			}
			if req.meta {
				if r.mg++; r.mg == len(req.asked) {
					return took, true, nil
				}
			}
			continue
		}
		i := bytes.IndexByte(data[took:], '\n')
		if i < 0 {
			r.acc = append(r.acc, data[took:]...)
			if len(r.acc)-r.line > lineLimit {
				return len(data), false, upstream.OutOfStep(upstream.ReasonMalformed, r.acc[r.line:])
			}
			return len(data), false, nil
		}
		r.acc = append(r.acc, data[took:took+i+1]...)
		took += i + 1
		line := r.acc[r.line:]
		if len(line) > lineLimit {
			return took, false, upstream.OutOfStep(upstream.ReasonMalformed, line) // no reply line is this long
		}
		if req.meta {
			if bytes.HasPrefix(line, metaValue) {
				size, _, err := upstream.ParseMetaValue(line)
				if err != nil {
					return took, false, upstream.OutOfStep(upstream.ReasonMalformed, line)
				}
				r.need = size + 2
				continue
			}
			// EN, or an error line for one key.
			if !wire.ReplyMetaGet.Fits(line) {
				return took, false, outOfStepAt(line)
			}
			r.line = len(r.acc)
			if r.mg++; r.mg == len(req.asked) {
				return took, true, nil
			}
			continue
		}
		if req.expect == wire.ReplyMetaArith {
			if n, ok := wire.ArithLine(line); ok {
				r.need = n // the number follows
				continue
			}
		}
		if !retrieval || !bytes.HasPrefix(line, replyValue) {
			return took, true, nil
		}
		v, ok := wire.ParseValue(line)
		if !ok || v.Size > upstream.MaxValueLen {
			return took, false, upstream.OutOfStep(upstream.ReasonMalformed, line)
		}
		r.vals = append(r.vals, valueAt{at: r.line, line: len(line), key: len(v.Key), flags: v.Flags, size: v.Size, cas: v.CAS, hasCAS: v.HasCAS})
		r.need = v.Size + 2
	}
	return took, false, nil
}

// closed ends a client on its loop. A connection that asked for a command
// the loop does not answer, or that closed its side with requests still
// buffered or replies owed, goes on in the goroutine path: evloop closes its
// descriptor after this returns, so it continues on a duplicate, and
// writes first what evloop held and dropped (see unwritten).
func (lc *loopClient) closed(err error) {
	c := lc.c
	delete(lc.ls.clients, lc)
	defer lc.dropPend() // once its bytes are handed over
	defer lc.noteOut()  // none: evloop drops them, or they are handed over
	gc := lc.gc
	kept := lc.kept
	lc.kept = nil
	unread := lc.buffered()
	if err != nil && !errors.Is(err, io.EOF) {
		lc.closing = true // a read or write failed: no one is left to answer
	}
	if lc.ls.l.abandon.Load() {
		lc.closing = true // the loops are stopping: an Execute may never run
	}
	if !lc.closing && lc.counted && (lc.handoff || err != nil) {
		flushWhileProgress(gc) // the less evloop holds, the less to hand over
	}
	end := func() { // the connection ends here, its replies dropped
		lc.gc = nil
		lc.abandon()
		c.p.untrack(c)
	}
	held := gc.OutboundBuffered()
	if lc.closing || !lc.handoff && (err == nil || len(lc.slots) == 0 && unread == 0 && held == 0) {
		end()
		return
	}
	h := &handover{replies: make(chan [][]byte, len(lc.slots))}
	if held > 0 {
		if err := lc.unwritten(gc, kept, h); err != nil {
			if lc.counted {
				c.p.log.Warn("client connection closed: replies evloop holds cannot be handed over", "remote", remoteOf(c.nc), "err", err)
			}
			end()
			return
		}
	}
	// The bytes of a request begun in pend come first.
	prefix := append(append([]byte(nil), lc.pend...), unhandled(gc, lc.tls)...)
	fd, derr := gc.Dup()
	if derr != nil {
		end()
		return
	}
	lc.gc = nil
	c.p.stats.connsHandedOver.Add(1)
	if len(lc.slots) > 0 {
		lc.hand = h
		lc.written() // the replies held back go first
	} else {
		close(h.replies)
	}
	l := lc.ls.l
	go func() {
		defer c.p.untrack(c)
		f := os.NewFile(uintptr(fd), "client")
		nc, err := net.FileConn(f)
		f.Close()
		if err == nil {
			// From here a shutdown that gave up waiting reaches the
			// socket (it closes the connections' sockets under wakeMu
			// after it set abandon), or this sees it gave up.
			c.wakeMu.Lock()
			c.nc = nc
			if l.abandon.Load() {
				err = net.ErrClosed
			}
			c.wakeMu.Unlock()
		}
		if err == nil && h.tail != nil {
			if err = h.writeTail(nc, l.stopped, c.p.cfg.IdleTimeout); errors.Is(err, os.ErrDeadlineExceeded) {
				c.p.stats.connsIdleClosed.Add(1)
				c.p.stats.connsOutputClosed.Add(1)
			}
		}
		if err != nil {
			if nc != nil {
				nc.Close()
			}
			for range h.replies {
			}
			return
		}
		if t := lc.tls; t != nil {
			// The TLS session goes on over the new socket, after the
			// bytes the loop read but did not decrypt.
			t.b.Conn, t.b.loop = nc, false
			nc = t.conn
		}
		c.adopt(nc, prefix)
		for b := range h.replies {
			bufs := net.Buffers(b)
			if err := c.cc.writeBuffers(&bufs); err != nil {
				for range h.replies {
				}
				nc.Close()
				return
			}
		}
		c.serve()
	}()
}

// flushWhileProgress has evloop write what it holds for gc for as long as
// the socket takes some.
func flushWhileProgress(gc *evloop.Conn) {
	for b := gc.OutboundBuffered(); b > 0; {
		gc.Flush()
		if a := gc.OutboundBuffered(); a < b {
			b = a
		} else {
			break
		}
	}
}

// unwritten puts in h the bytes of replies evloop holds for gc, the end of
// kept, which evloop drops when it closes its descriptor after one more
// write, with how many bytes the socket had been given then.
func (lc *loopClient) unwritten(gc *evloop.Conn, kept []byte, h *handover) error {
	held := gc.OutboundBuffered()
	switch {
	case !lc.counted:
		return errors.ErrUnsupported // a socket that does not count what it was given
	case held > len(kept):
		return errors.New("evloop holds bytes not kept")
	}
	wrote, err := sockio.Written(gc.Fd())
	if err != nil {
		return err
	}
	done := make(chan struct{})
	// evloop's last write and close happen before the loop runs this.
	err = lc.ls.el.Execute(func() {
		close(done)
	})
	if err != nil {
		return err
	}
	h.tail = append([]byte(nil), kept[len(kept)-held:]...)
	h.wrote, h.loopDone = wrote, done
	return nil
}

// full reports whether evloop holds so much of the client's replies that
// the next must wait.
func (lc *loopClient) full() bool {
	return lc.gc != nil && lc.gc.OutboundBuffered() > loopOutMax
}

// abandon drops the replies a closed client is owed, at once those held
// back and the rest as they come.
func (lc *loopClient) abandon() {
	for _, s := range lc.slots {
		if s != nil { // a written() this close runs inside has passed it
			s.noreply = true
		}
	}
	lc.written()
}

// handover carries the replies a client is owed to the goroutine that
// goes on with it, in order; it is closed after the last. Bytes of replies
// evloop held when it closed its descriptor go before them: tail, of which
// evloop's last write may have taken some after the socket had been given
// wrote bytes in all; loopDone is closed once that write is over.
type handover struct {
	replies  chan [][]byte
	tail     []byte
	wrote    uint64
	loopDone chan struct{}
}

// writeTail writes the bytes of tail that evloop's last write did not take,
// straight to the socket (over TLS they are records already), within
// timeout if there is one, unless the loops stopped first. They were
// counted when evloop took them.
func (h *handover) writeTail(nc net.Conn, stopped <-chan struct{}, timeout time.Duration) error {
	select {
	case <-h.loopDone:
	case <-stopped:
		return net.ErrClosed // the loops stopped before they ran the signal
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return errors.New("handover: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var now uint64
	cerr := rc.Control(func(fd uintptr) { now, err = sockio.Written(int(fd)) })
	if err = errors.Join(cerr, err); err != nil {
		return err
	}
	took := now - h.wrote
	if now < h.wrote || took > uint64(len(h.tail)) {
		return fmt.Errorf("handover: the socket took %d bytes after evloop held %d", int64(took), len(h.tail))
	}
	if timeout > 0 {
		nc.SetWriteDeadline(time.Now().Add(timeout))
	}
	_, err = nc.Write(h.tail[took:])
	h.tail = nil
	return err
}

// loopCopyMax is the most bytes of a reply the loop copies into evloop's
// buffer when the client's socket does not take it all at once. A longer
// rest goes to the goroutine path with the connection, which writes it
// from the buffers it is in.
const loopCopyMax = 256 << 10

// send writes a reply: straight to the socket when nothing waits before
// it, and what the socket does not take into evloop's buffer, which writes
// it once the socket has room. It returns nil, or the rest of a reply too
// long to copy, for which it has begun to hand the connection over.
func (lc *loopClient) send(out [][]byte) [][]byte {
	if lc.tls != nil {
		lc.sendTLS(out)
		return nil
	}
	n, rest, ok := lc.put(out, loopCopyMax)
	lc.c.p.stats.bytesWritten.Add(uint64(n))
	if !ok || len(rest) == 0 {
		return nil
	}
	lc.handoff = true
	lc.gc.Close() // closed() starts the handover
	return rest
}

// sendTLS writes a reply over TLS: encrypted whole, so that its pieces do
// not each make a record, and put as send puts a plain one, except that
// evloop takes whatever the socket does not, however long (the goroutine
// path could not go on with a TLS session whose record was half written).
func (lc *loopClient) sendTLS(out [][]byte) {
	t := lc.tls
	plain := lc.ls.sealBuf[:0]
	for _, b := range out {
		plain = append(plain, b...)
	}
	lc.ls.sealBuf = plain[:0]
	if cap(plain) > tlsKeepMax {
		lc.ls.sealBuf = nil
	}
	if _, err := t.conn.Write(plain); err != nil {
		lc.closing = true
		lc.gc.Close()
		return
	}
	lc.c.p.stats.bytesWritten.Add(uint64(len(plain)))
	lc.putSealed()
}

// putSealed writes the records TLS wrote to the bridge, as put writes a
// reply, except that evloop takes whatever the socket does not.
func (lc *loopClient) putSealed() {
	t := lc.tls
	sealed := t.b.out
	if len(sealed) == 0 {
		return
	}
	t.b.out = sealed[:0]
	if cap(sealed) > tlsKeepMax {
		t.b.out = nil
	}
	lc.put([][]byte{sealed}, math.MaxInt)
}

// put writes bufs straight to the socket when evloop holds none of the
// client's bytes, and gives evloop the rest the socket does not take, up to
// copyMax bytes; when evloop holds some, it gives evloop all. It returns how
// many bytes it wrote or gave evloop and the rest it did not, or ok false
// when the write failed, which closes the connection.
func (lc *loopClient) put(bufs [][]byte, copyMax int) (n int, rest [][]byte, ok bool) {
	gc := lc.gc
	if gc.OutboundBuffered() > 0 {
		if lc.counted && bufsLen(bufs) > copyMax {
			return 0, bufs, true
		}
		n, _ = gc.Writev(bufs)
		lc.keep(bufs)
		return n, nil, true
	}
	rest, n, iov, err := sockio.WriteSome(gc.Fd(), bufs, lc.iov)
	lc.iov = iov
	if err != nil {
		lc.closing = true
		gc.Close()
		return n, nil, false
	}
	left := bufsLen(rest)
	if left > copyMax {
		return n, rest, true
	}
	if left > 0 {
		gc.Writev(rest)
		lc.keep(rest)
	}
	return n + left, nil, true
}

// detach copies the upstream replies of slot s out of the chunks they
// were read into, points the pieces of out (s's reply, or what is left of
// it) into the copies, and lets go of the chunks: a client that the loop
// holds back (see full), or whose connection moves to a goroutine, keeps
// its replies' bytes, not the chunks they share with everyone else's.
// Each upstream reply is copied once, so a value that the reply names
// many times (a key repeated in one get) is still held once; and a reply
// that has a chunk to itself, at least half full, is not copied at all:
// the slot keeps the chunk, which nothing else reads into.
func (ls *loopState) detach(s *loopSlot, out [][]byte) {
	for _, r := range s.reqs {
		if r.share == nil || r.share.refs == 1 && 2*len(r.buf) >= cap(r.share.buf) {
			continue
		}
		b := slices.Clone(r.buf)
		for i, piece := range out {
			if off, ok := within(piece, r.buf); ok {
				out[i] = b[off : off+len(piece) : off+len(piece)]
			}
		}
		ls.release(r.share)
		r.share, r.buf = nil, b
	}
}

// within reports whether piece lies inside buf, and where it begins there.
func within(piece, buf []byte) (int, bool) {
	if len(piece) == 0 || len(buf) == 0 {
		return 0, false
	}
	off := int(uintptr(unsafe.Pointer(&piece[0])) - uintptr(unsafe.Pointer(&buf[0])))
	return off, off >= 0 && off+len(piece) <= len(buf)
}

// bufsLen is how many bytes bufs holds.
func bufsLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

// keep copies bufs, just given to evloop, after the bytes kept before, and
// keeps only as many as evloop holds: it writes in order, so what it holds
// is the end of what it was given. The copy is what a handover writes of
// the replies evloop drops when it closes its descriptor (see closed).
func (lc *loopClient) keep(bufs [][]byte) {
	if lc.gc == nil || !lc.counted {
		return // the write failed and closed the connection, or no use
	}
	for _, b := range bufs {
		lc.kept = append(lc.kept, b...)
	}
	lc.trimKept()
}

// trimKept drops the kept bytes evloop has written, and the buffer once it
// holds none.
func (lc *loopClient) trimKept() {
	switch held := lc.gc.OutboundBuffered(); {
	case held == 0 && cap(lc.kept) > tlsKeepMax:
		lc.kept = nil
	case held == 0:
		lc.kept = lc.kept[:0]
	case held < len(lc.kept):
		lc.kept = lc.kept[len(lc.kept)-held:]
	}
}
