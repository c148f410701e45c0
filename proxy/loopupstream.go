package proxy

import (
	"bytes"
	"context"
	"net"
	"time"

	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// loopUpstream is one loop's connection to one server.
type loopUpstream struct {
	ls      *loopState
	srv     *upstream.Server
	gc      *evloop.Conn
	dialing bool
	// late is when the oldest request written was first seen past the
	// timeout, and latePoll the loop's poll count then (see check).
	late     time.Time
	latePoll uint64
	out      []byte   // requests not written yet
	q        reqQueue // requests in order; the first sent are written
	sent     int
	scan     upstream.ReplyScan
	// chunk is what replies are read into while one is being read:
	// scan.Acc is the tail of it, from where that reply begins.
	chunk *chunks.Share
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
	// waitFrom is when memcached could begin the reply: the request's
	// write, or the end of the reply before it. The upstream timeout runs
	// from here, so that no request is charged with the replies ahead of
	// it on the connection.
	waitFrom time.Time
	// retried: the request was asked again on a new connection once, after
	// the one it was written to failed before its reply began (see fail).
	retried bool
	asked   []int  // owner indexes, in the order the keys were asked
	buf     []byte // the reply, which the owners' blocks point into
	err     error
	// joined is how many requests after this one in the queue share its
	// get line (see loopUpstream.join); share, the chunk buf is in.
	joined int
	share  *chunks.Share
	// ends marks the last request of one write upstream (a batch).
	ends bool
	// expect is the family of the reply to a command of one key.
	expect wire.Reply
	// A fill's key, and the count of its write stripe its read noted
	// (see writeguard); undo, that a write raced it and it is deleted
	// again (dropUnfill, whose key it is too).
	key  []byte
	gen  uint64
	undo bool
}

// want is the reply r awaits.
func (r *loopReq) want() upstream.Want {
	w := upstream.Want{Store: r.store, Expect: r.expect}
	if r.meta {
		w.MetaGets = len(r.asked)
	}
	return w
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
// 700 KB values (compare.sh's load 5), with chunks kept (see chunks.Pool), not
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
		(h.slot.id == wire.CmdGets) != (id == wire.CmdGets) || u.joinKeys+n > u.ls.l.p.cfg.GetBatchKeys {
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
		r.began, r.waitFrom = u.ls.now, u.ls.now
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
	// The first request, and those sharing its get line, are the reply
	// that failed; a retrieval behind them had no byte of its reply read,
	// and is asked once more, on a new connection: reading an item twice
	// changes nothing a client can tell.
	first := 1 + q[0].joined
	for i, r := range q {
		switch {
		case r.drop > 0:
			u.ls.l.p.countDropped(r, nil, err)
			u.dropped(r)
		case i >= first && !r.store && !r.retried:
			r.retried, r.joined, r.ends = true, 0, false
			r.slot.ask(u, r)
		default:
			r.done(nil, err)
		}
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

// countDropped counts the reply (or err) of a request whose reply is
// dropped, by its kind.
func (p *Proxy) countDropped(r *loopReq, reply []byte, err error) {
	switch r.drop {
	case dropCorrupt:
		if err == nil && bytes.Equal(reply, wire.LineDeleted) {
			p.stats.CodecDeleted.Add(1)
		}
	case dropFill:
		result := zones.FillNotStored
		switch {
		case err != nil:
			result = zones.FillFailed
		case bytes.Equal(reply, wire.LineStored), bytes.HasPrefix(reply, metaCodeStored): // add's, or an mg fill's ms
			result = zones.FillStored
		}
		if zones.MayHaveStored(result) && p.guard.WroteSince(r.key, r.gen) {
			r.undo, result = true, zones.FillDropped // see dropped
		}
		p.fills[result].Add(1)
	case dropUnfill:
		p.wroteOf(r.key)
		if err == nil && stats.IsServerError(reply) {
			r.srv.CountServerError()
		}
	case dropAlign, dropUndo:
		if err == nil && stats.IsServerError(reply) {
			r.srv.CountServerError()
		}
		if r.drop == dropAlign && writeFailed(reply, err) {
			p.zones[r.zone].WriteFailures.Add(1)
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
