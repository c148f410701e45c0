package proxy

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"slices"
	"time"

	"mcsidecar/codec"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

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
	// A gat or gats: its keys are touched with exptime (see
	// getAndTouch), a key named again is a miss when expireNow, and a
	// key refused after the keys asked makes the reply CLIENT_ERROR
	// (refuse).
	touch, expireNow, refuse bool
	exptime                  int32
	// kind is the classic write whose zone rules a command of one key
	// follows: its own id, or for ms and md the write they act as (see
	// metaKind). meta is a meta command's request (see loopmeta.go), nil
	// for a classic command; spareMeta, one kept for the loop's next meta
	// command (see takeMeta).
	kind            int
	meta, spareMeta *loopMeta
	// serial: nothing the client sent after it is sent upstream before
	// it is answered, as it takes more than one round trip and what came
	// after it must see what it did (see heldBehind).
	serial bool
	// mod is a read-modify-write's state (see loopmodify.go); spareMod,
	// one kept for the next.
	mod, spareMod *loopModify
}

// loopWrite is what a storage command's write adds to the byte counters
// once stored: the bytes written, per tenant, and for an enveloped value,
// the client's bytes and the stored ones.
type loopWrite struct {
	tenant    *stats.TenantCounters
	size      int
	enveloped bool
	logical   int
	// refused: the write is the delete of the old value of a set refused
	// as too large (see tooLarge), which counts as nothing itself.
	refused bool
}

// loopSeed seeds the hashes of the keys a retrieval looks for repeats of.
var loopSeed = maphash.MakeSeed()

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
	tenant *stats.TenantCounters
	// bound: the key is sent rewritten, as ups[upStart:upEnd], and its
	// value is an envelope bound to it.
	bound          bool
	upStart, upEnd int
	// The block written anew (opened, its CAS dropped, or another zone's
	// hit) is arena[arenaStart:arenaEnd]; arenaEnd is 0 for one that is
	// not. For an envelope that holds its value as it is, the arena holds
	// only the VALUE line, and the value is view, in the chunk memcached's
	// reply is in (see open).
	arenaStart, arenaEnd int
	view                 []byte
	inPlace              bool
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
	// writeguard); inTier, that the tier answered it, from the arena.
	immutable, inTier bool
	gen               uint64
	// corrupt: the key's envelope was damaged (see open).
	corrupt bool
}

// stored returns the value of o's block as memcached holds it.
func (o *loopOwner) stored() []byte { return o.block[len(o.block)-o.size-2 : len(o.block)-2] }

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
func (ls *loopState) answerJoined(group []*loopReq, sh *chunks.Share, reply []byte, vals []upstream.ValueAt) {
	start := 0
	for _, r := range group {
		n := r.slot.match(r, reply, vals)
		end := start
		if n > 0 {
			end = vals[n-1].End()
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

// release ends one thing the slot's made reply waits for (a request whose
// reply is dropped, or the making of the reply itself), and writes the
// replies that are ready once nothing is left.
func (s *loopSlot) release() {
	if s.pending--; s.pending == 0 {
		s.client.written()
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
	if need := s.openNeed(); need > 0 {
		s.reserve(need)
		if need >= loopOpenAsideMin && s.client.ls.servesLight() && s.client.ls.l.aside(s) {
			return // opened on a worker, which has the loop complete it
		}
		s.openAll(false)
	}
	s.complete()
}

// complete answers a retrieval whose hits are opened, and fills the local
// zone with what the other zones had.
func (s *loopSlot) complete() {
	s.answer()
	s.touchOtherZones()
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
	if s.id == wire.CmdFlushAll {
		s.flushedOne(r, reply, err)
		return
	}
	if err == nil && stats.IsServerError(reply) {
		r.srv.CountServerError()
	}
	if s.mod != nil {
		s.modified(r, reply, err)
		return
	}
	if s.id == wire.CmdMetaGet || s.id == wire.CmdMetaDebug {
		s.metaGot(r, reply, err)
		return
	}
	zoneByZone := p.zoneByZone(s.kind)
	switch {
	case zoneByZone:
		var decided bool
		if reply, decided, err = s.decide(r, reply, err); !decided {
			return
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
				p.zones[z].WriteFailures.Add(1)
			}
		}
		reply, err = answer.buf, answer.err
		if s.kind == wire.CmdAdd && err == nil {
			reply = s.addHeld(reply)
		}
	}
	if s.retryVivify(reply, err) {
		return
	}
	if zoneByZone && err == nil && p.cfg.ZoneWrites != zones.WritesLocal {
		s.align(reply) // the other zones follow the one that answered
	}
	p.wroteOf(s.ups)
	switch {
	case s.meta != nil:
		s.metaAnswer(reply, err)
	case err != nil:
		line, oc := upstreamReply(err)
		if !s.write.refused {
			st.Record(s.id, oc)
		}
		s.out = append(s.out, line)
	default:
		oc := stats.ReplyOutcome(reply)
		if !s.write.refused {
			st.Record(s.id, oc)
		}
		if oc == stats.OutcomeStored {
			s.countWrite()
		}
		s.line = append(s.line[:0], reply...)
		s.out = append(s.out, s.line)
	}
	// The reply goes once the writes bringing other zones in line are
	// answered too (see alignZone).
	s.release()
}

// countWrite counts the bytes of a write that took.
func (s *loopSlot) countWrite() {
	w := s.write
	if w.enveloped {
		s.client.c.countStored(w.logical, w.size)
	}
	if w.tenant != nil {
		w.tenant.Written.Add(uint64(w.size))
	}
}

// match points each asked key of r at its VALUE block in reply, whose
// VALUE lines, from r's first on, are vals: memcached answers hits in the
// order the keys were asked and skips misses. A reply that is not a
// retrieval's (an error line) has none, and leaves every key a miss. It
// returns how many of vals are r's: in a reply to a joined line, the
// blocks of the requests after r follow.
func (s *loopSlot) match(r *loopReq, reply []byte, vals []upstream.ValueAt) int {
	k := 0
	for n := range vals {
		v := &vals[n]
		key := v.KeyIn(reply)
		for k < len(r.asked) && !bytes.Equal(s.upKey(r.asked[k]), key) {
			k++
		}
		if k == len(r.asked) {
			return n
		}
		o := &s.owners[r.asked[k]]
		o.block, o.flags, o.size, o.cas, o.hasCAS = v.Block(reply), v.Flags, v.Size, v.CAS, v.HasCAS
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
		if !bytes.HasPrefix(line, wire.LineMetaValue) {
			if !bytes.Equal(line, wire.LineMetaMiss) {
				o.err = fmt.Errorf("mg: memcached replied: %q", line)
			}
			b = b[j+1:]
			continue
		}
		size, it, err := upstream.ParseMetaValue(line) // the scan read it: no error
		if err != nil {
			o.err = err
			return
		}
		end := j + 1 + size + 2
		o.block, o.flags, o.size, o.cas, o.hasCAS, o.ttl, o.meta = b[:end:end], it.Flags, size, it.CAS, true, it.TTL, true
		b = b[end:]
	}
}

// answer builds a retrieval's reply once every request is in.
func (s *loopSlot) answer() {
	p := s.client.c.p
	st := p.stats
	if s.refuse {
		st.Record(s.id, stats.OutcomeClientError)
		s.out = append(s.out, wire.LineBadFormat)
		return
	}
	oc := stats.OutcomeOK
	if o := s.failed(); o != nil {
		if p.cfg.RetrievalFailure == failureError {
			line, _ := upstreamReply(o.err)
			st.Record(s.id, stats.OutcomeUpstreamError)
			s.out = append(s.out, line)
			return
		}
		oc = stats.OutcomeUpstreamError // the failed requests' keys are misses
	}
	for i := range s.owners {
		if o := &s.owners[i]; o.corrupt && p.cfg.Codec.DeleteCorrupt {
			s.deleteCorrupt(o.zone, s.upKey(i))
		}
	}
	tally := stats.Tally{Touch: s.touch}
	for i := range s.owners {
		o := &s.owners[i]
		src := o // the owner whose block answers: the same key named earlier, or o
		if o.first > 0 {
			src = &s.owners[o.first-1]
			if s.expireNow {
				// memcached expired the item as it answered it.
				tally.Add(o.tenant, false)
				continue
			}
		}
		block := src.block // o.block stays memcached's, which a fill stores
		if src.arenaEnd > 0 {
			block = s.arena[src.arenaStart:src.arenaEnd:src.arenaEnd]
		}
		hit := block != nil
		if hit {
			s.out = append(s.out, block)
			if src.inPlace {
				s.out = append(s.out, src.view, wire.CRLF)
			}
		}
		tally.Add(o.tenant, hit)
	}
	tally.Flush(st)
	st.Record(s.id, oc)
	s.out = append(s.out, wire.LineEnd)
}

// failed returns the first key whose last zone asked failed, which was not
// answered, or nil.
func (s *loopSlot) failed() *loopOwner {
	for i := range s.owners {
		if o := &s.owners[i]; o.first == 0 && o.err != nil {
			return o
		}
	}
	return nil
}

// rewritten reports whether owner o's block is written anew into the
// slot's arena: opened, its CAS dropped, or an mg reply made a VALUE block.
func (s *loopSlot) rewritten(o *loopOwner) bool {
	p := s.client.c.p
	return o.first == 0 && o.block != nil && (o.meta || o.bound || p.codec != nil && p.codec.IsEnveloped(o.flags) || o.hasCAS && s.id == wire.CmdGet)
}

// openNeed is the arena room the blocks written anew need, or 0 when the
// reply is an error whatever they hold.
func (s *loopSlot) openNeed() int {
	if s.refuse || s.client.c.p.cfg.RetrievalFailure == failureError && s.failed() != nil {
		return 0
	}
	need := 0
	for i := range s.owners {
		if o := &s.owners[i]; s.rewritten(o) {
			need += s.arenaNeed(i, o)
		}
	}
	return need
}

// openAll writes the blocks written anew into the arena, reserved first
// for all of them (it would move as it grew): they are pointed at once all
// are in. It touches no state of the loop but the slot's, and the
// counters and the local tier, which take writes from any goroutine: it
// may run on a worker (see eventLoops.aside), which yields as it goes
// where the workers have no Ps of their own (see asideWorkers).
func (s *loopSlot) openAll(aside bool) {
	done := 0
	for i := range s.owners {
		o := &s.owners[i]
		if !s.rewritten(o) {
			continue
		}
		at := len(s.arena)
		if !s.open(i, o) {
			o.block = nil
		}
		if done += o.size + len(s.arena) - at; aside && !lowersPriority && done >= asideYieldBytes {
			done = 0
			runtime.Gosched()
		}
	}
}

// open replaces an enveloped hit's block with the value it carries, and
// reports whether it is still a hit: a refused envelope is a miss, and a
// damaged one is deleted, by answer, when --codec-delete-corrupt asks for it.
func (s *loopSlot) open(i int, o *loopOwner) bool {
	p := s.client.c.p
	key := s.key(i)
	stored := o.stored()
	if o.bound && !p.codec.IsEnveloped(o.flags) {
		// Under a rewritten key, a plain item is some client's own value
		// at an equal key: a miss.
		p.stats.KeyUnbound.Add(1)
		return false
	}
	if p.codec == nil || !p.codec.IsEnveloped(o.flags) {
		// A plain value whose header names a CAS the client's get did
		// not ask for, or an mg reply.
		s.inArena(o, key, o.flags, stored, o.cas, s.id == wire.CmdGets || s.id == wire.CmdGats)
		s.keep(i, o, key, o.flags, stored)
		return true
	}
	// The value is decoded straight into the arena, behind the header
	// its envelope announces, or, held in the envelope as it is, answered
	// from where it lies, with only its header in the arena (values
	// compressed already, as Mimir's postings, are not copied); a refused
	// one takes its header back.
	start := len(s.arena)
	n, flags, ok := p.codec.DecodedLen(o.flags, stored)
	if ok {
		s.arena = appendValueHeader(s.arena, key, flags, n, o.cas, s.id == wire.CmdGets || s.id == wire.CmdGats)
	}
	at := len(s.arena)
	out, decFlags, inPlace, err := p.codec.AppendDecodeInPlace(s.arena, key, o.bound, o.flags, stored)
	got := len(out) - at
	if inPlace {
		got = len(out)
	}
	if err != nil || got != n || decFlags != flags {
		s.arena = s.arena[:start]
		r := codec.ReasonOf(err)
		if err == nil {
			r = codec.ReasonOf(codec.ErrLengthMismatch) // the codec broke its word: a miss all the same
		}
		p.stats.CodecRefused[r&15].Add(1)
		o.corrupt = r.Damaged() // deleted by answer, on the loop
		return false
	}
	var v []byte
	if inPlace {
		o.view, o.inPlace, v = out, true, out
	} else {
		s.arena = append(out, wire.CRLF...)
		v = s.arena[at : at+n]
	}
	o.arenaStart, o.arenaEnd = start, len(s.arena)
	p.stats.CodecReadLogical.Add(uint64(n))
	p.stats.CodecReadStored.Add(uint64(len(stored)))
	s.keep(i, o, key, flags, v)
	return true
}

// reserve makes room for need more bytes in the slot's arena: in the
// smallest long enough of the arenas the loop kept from earlier long
// replies, or in a new one. A new long arena is sized up to a power of
// two, so that, once kept, it serves the long replies after it too: each
// new one is zeroed by the runtime, which for megabytes of rebuilt
// postings a request cost as much as 4 % of the sidecar's CPU.
func (s *loopSlot) reserve(need int) {
	if cap(s.arena)-len(s.arena) >= need {
		return
	}
	ls := s.client.ls
	want := len(s.arena) + need
	best := -1
	for i, a := range ls.arenas {
		if cap(a) >= want && (best < 0 || cap(a) < cap(ls.arenas[best])) {
			best = i
		}
	}
	if best >= 0 {
		a := append(ls.arenas[best], s.arena...)
		last := len(ls.arenas) - 1
		ls.arenas[best], ls.arenas[last] = ls.arenas[last], nil
		ls.arenas = ls.arenas[:last]
		s.arena = a
		return
	}
	if want > loopBufLimit && want <= loopArenaKeep {
		size := min(1<<bits.Len(uint(want-1)), loopArenaKeep)
		s.arena = append(make([]byte, 0, size), s.arena...)
		return
	}
	s.arena = slices.Grow(s.arena, need)
}

// arenaNeed is at most what open writes into the arena for owner o's hit:
// its VALUE line and the value, decoded when enveloped.
func (s *loopSlot) arenaNeed(i int, o *loopOwner) int {
	p := s.client.c.p
	line := len(wire.LineValue) + len(s.key(i)) + 3*20 + 4 + len(wire.CRLF)
	if p.codec != nil {
		if n, _, ok := p.codec.DecodedLen(o.flags, o.stored()); ok {
			return line + n
		}
	}
	return line + o.size
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
	s.arena = appendValueHeader(s.arena, key, flags, len(v), cas, withCAS)
	s.arena = append(s.arena, v...)
	s.arena = append(s.arena, wire.CRLF...)
	o.arenaEnd = len(s.arena)
}

// deleteCorrupt deletes a damaged item, at its upstream key, in the zone
// it was found in. The retrieval's reply waits for the delete's, so that
// a client that saw the miss never finds the item still there.
func (s *loopSlot) deleteCorrupt(zone int, key []byte) {
	lc := s.client
	u := lc.ls.upstreamOf(lc.c.p.zones[zone].Up.Load(), key)
	if !u.queueDropped(s, dropCorrupt, zone, wire.ReplyDelete) {
		return // its server is ejected
	}
	u.out = append(u.out, "delete "...)
	u.out = append(u.out, key...)
	u.out = append(u.out, wire.CRLF...)
}
