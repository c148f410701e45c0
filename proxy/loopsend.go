package proxy

import (
	"bytes"
	"slices"
	"strconv"
	"time"

	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
)

// retrieve sends a get or gets to the servers of its keys, one request
// per server.
func (lc *loopClient) retrieve(id int, keys [][]byte) {
	c := lc.c
	ls := lc.ls
	taken, why, rewrites := lc.inspectAll(keys)
	if taken < len(keys) {
		// Refused whole, as memcached refuses it.
		lc.local(id, func() { c.refuseKeys(id, why) })
		return
	}
	p := c.p
	up := p.zones[0].Up.Load()
	s := ls.slot(lc, id)
	lc.charge(s, lc.estimate(len(keys)))
	need := needTenant
	if p.tier != nil {
		need |= needImmutable
	}
	var ups [4]*loopUpstream // each request's server; more than four are rare
	reqUps := ups[:0]
	var run stats.TenantRun
	defer run.End()
	for i, k := range keys {
		rk := c.resolveChecked(k, need, rewrites[i])
		o, first := s.owner(k, i, len(keys), rk, &run)
		o.immutable = rk.immutable
		if rk.immutable {
			// get answers from the tier; gets needs memcached's CAS. A key
			// named again is answered as the first time, but looked up
			// again, so that the tier counts every naming, as memcached's
			// get_hits do.
			e, gen := p.fromTier(k, string(rk.up), id == wire.CmdGet, s.began.UnixNano())
			if first < 0 {
				o.gen = gen
				if e != nil {
					o.inTier = true
					s.inArena(&o, k, e.Flags, e.Value, 0, false)
				}
			}
		}
		s.owners = append(s.owners, o)
		if first >= 0 || o.inTier || !rk.ok {
			continue // a key no server can hold is a miss
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
	return
}

// loopRewritesKeep is the most keys whose rewrite bits a loop keeps room
// for between retrievals (see inspectAll).
const loopRewritesKeep = 1024

// inspectAll scans each of keys once (see inspect), up to the first one
// refused, and returns how many were taken, why the next one was refused,
// and whether each taken one is sent upstream rewritten, in the loop's
// scratch: valid until the next inspectAll.
func (lc *loopClient) inspectAll(keys [][]byte) (taken int, why keyspace.Reason, rewrites []bool) {
	rewrites = lc.ls.rewrites[:0]
	for _, k := range keys {
		kc := lc.c.inspect(k)
		if !kc.ok {
			why = kc.reason
			break
		}
		rewrites = append(rewrites, kc.rewrite)
	}
	if cap(rewrites) <= loopRewritesKeep {
		lc.ls.rewrites = rewrites
	}
	return len(rewrites), why, rewrites
}

// owner adds key k, the i-th of the n keys of retrieval s, resolved as rk,
// and returns its owner and the owner of the same key named earlier, or
// -1: a key named again is fetched once and answered as often as it was
// named, as memcached does.
func (s *loopSlot) owner(k []byte, i, n int, rk resolvedKey, run *stats.TenantRun) (loopOwner, int) {
	first := s.named(k, i, n)
	s.keys = append(s.keys, k...)
	s.ends = append(s.ends, len(s.keys))
	o := loopOwner{first: first + 1, tenant: run.Counters(s.client.c.p.tenants, rk.tenant), bound: rk.bound}
	if rk.bound {
		o.upStart = len(s.ups)
		s.ups = append(s.ups, rk.up...)
		o.upEnd = len(s.ups)
	}
	return o, first
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
			u.out = append(u.out, " v f t c"...)
			if s.touch {
				u.out = append(u.out, " T"...)
				u.out = strconv.AppendInt(u.out, int64(s.exptime), 10)
			}
			u.out = append(u.out, wire.CRLF...)
		}
	} else {
		var head *loopReq
		if !s.touch {
			head = u.joinable(s.id, len(r.asked))
		}
		if joined = head != nil; joined {
			// The keys go on the end of head's line.
			u.out = u.out[:len(u.out)-len(wire.CRLF)]
			head.joined++
		} else {
			u.out = append(u.out, retrievalVerbs[s.id]...)
			if s.touch {
				u.out = append(u.out, ' ')
				u.out = strconv.AppendInt(u.out, int64(s.exptime), 10)
			}
			head, u.joinKeys = r, 0
		}
		for _, i := range r.asked {
			u.out = append(u.out, ' ')
			u.out = append(u.out, s.upKey(i)...)
		}
		u.out = append(u.out, wire.CRLF...)
		u.join, u.joinEnd = head, len(u.out)
		if u.joinKeys += len(r.asked); u.joinKeys > loopJoinKeys && head == r || s.touch {
			u.join = nil // too long to be joined, or with an exptime of its own
		}
	}
	u.q.push(r)
	if s.zone == 0 && !r.retried {
		// Counted once: its reads of other zones are not.
		u.srv.CountGet(len(r.asked), joined)
	}
}

// retrievalVerbs names the retrievals upstream.
var retrievalVerbs = [wire.NumCommands]string{wire.CmdGet: "get", wire.CmdGets: "gets", wire.CmdGat: "gat", wire.CmdGats: "gats"}

// store sends a storage command, its value enveloped when the codec or a
// rewritten key asks for it. An append or prepend to an enveloped value
// is a read-modify-write (see modify). A value over the size limits is
// refused (see tooLarge).
func (lc *loopClient) store(id int, words [][]byte, data []byte, lineLen int) int {
	c := lc.c
	a := wire.ParseStoreArgs(words, id == wire.CmdCas)
	var kc keyCheck
	if a.ArgsOK {
		kc = c.inspect(a.Key)
	}
	if !a.ArgsOK || !lc.takes(a.Key, kc) {
		// Refused: its block, when the line names a usable length, is
		// dropped as it comes.
		if a.ArgsOK && !kc.ok {
			c.countRefused(kc.reason)
		}
		c.p.stats.CmdSet.Add(1)
		lc.refuse(id, a.Noreply, wire.LineBadFormat)
		if !a.LenOK {
			return lineLen
		}
		return lc.dropBlock(lineLen+a.Vlen+2, data)
	}
	join := id == wire.CmdAppend || id == wire.CmdPrepend
	envFlags := a.Flags
	if join {
		envFlags = 0 // memcached ignores the flags of append and prepend
	}
	// A value under a rewritten key is always enveloped, bound to the
	// client key: another key may meet it upstream.
	enveloped := c.envelopes(a.Key, envFlags) || kc.rewrite
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	total := lineLen + a.Vlen + 2
	if a.Vlen > limit {
		// Refused before its block is read, which is dropped as it comes.
		lc.tooLarge(id, a, c.lookupChecked(a.Key, needTenant, kc.rewrite))
		return lc.dropBlock(total, data)
	}
	if n, whole := lc.awaitBlock(total, data); !whole {
		return n
	}
	rk := c.lookupChecked(a.Key, needTenant|postingsIf(enveloped), kc.rewrite)
	if !bytes.HasSuffix(data[:total], wire.CRLF) {
		lc.countStore(rk)
		lc.refuse(id, a.Noreply, wire.LineBadChunk)
		return total
	}
	value, flags := data[lineLen:lineLen+a.Vlen], a.Flags
	if enveloped && join {
		// memcached cannot join bytes to an envelope: the value is read,
		// joined and written back (see loopmodify.go).
		lc.countStore(rk)
		lc.modify(id, a.Key, rk, a.Noreply, nil, value, func(c *conn, data []byte) rmw { return c.joinOp(id, data) })
		return total
	}
	if enveloped {
		value, flags = c.encodeFor(a.Key, rk.bound, rk.postings, a.Flags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			lc.tooLarge(id, a, rk)
			return total
		}
	}
	tenant := lc.countStore(rk)
	w := loopWrite{tenant: tenant, size: len(value), enveloped: enveloped, logical: a.Vlen}
	lc.command(id, rk.up, a.Noreply, w, func(out []byte, _ uint32) []byte {
		out = wire.AppendStorage(out, wire.StorageVerbs[id], string(rk.up), flags, a.Exptime, len(value), a.CAS, id == wire.CmdCas)
		out = append(out, value...)
		return append(out, wire.CRLF...)
	})
	return total
}

// awaitBlock reports whether all total bytes of a request with a data
// block, from the start of data, are here. When they are not, it returns
// how many bytes the request takes meanwhile: all of data when the rest
// is read into a buffer of the request's own (see pend), otherwise none,
// and the request is parsed again once total bytes are buffered (want).
func (lc *loopClient) awaitBlock(total int, data []byte) (took int, whole bool) {
	if len(data) >= total {
		return 0, true
	}
	if lc.pendable(total, len(data)) {
		var buf []byte
		if total >= chunks.Size {
			lc.pendSh = lc.ls.pool.Get(total)
			buf = lc.pendSh.Buf
		} else {
			buf = make([]byte, 0, total)
		}
		lc.pend = append(buf[:0:total], data...)
		return len(data), false
	}
	lc.want = total // from where this request begins, the first once process hands what came before
	return 0, false
}

// refuse answers a storage command refused with reply, in its place
// (noreply drops the reply).
func (lc *loopClient) refuse(id int, noreply bool, reply []byte) {
	c := lc.c
	lc.local(id, func() {
		c.noreply = noreply
		c.p.stats.Record(id, stats.OutcomeClientError)
		c.reply(reply)
	})
}

// countStore counts a storage command the loop takes, as the goroutine
// path counts it, and returns its tenant's counters, if any.
func (lc *loopClient) countStore(rk resolvedKey) *stats.TenantCounters {
	c := lc.c
	c.countRewrite(rk)
	c.p.stats.CmdSet.Add(1)
	tenant := c.p.tenants.Counters(rk.tenant)
	if tenant != nil {
		tenant.Requests.Add(1)
	}
	return tenant
}

// tooLarge refuses a storage command whose value is over the size limits:
// SERVER_ERROR in its place among the replies, and for a set, the old
// value deleted upstream first, as memcached drops it before it answers
// rather than keep serving it after a set it could not store. The
// refusal's reply waits for the delete's, since a client's replies go in
// request order: once told, no client reads the old value.
func (lc *loopClient) tooLarge(id int, a wire.StoreArgs, rk resolvedKey) {
	c := lc.c
	lc.countStore(rk)
	if id == wire.CmdSet {
		lc.command(wire.CmdDelete, rk.up, true, loopWrite{refused: true}, func(out []byte, _ uint32) []byte {
			return appendKeyCommand(out, keyVerbs[wire.CmdDelete], string(rk.up), nil)
		})
	}
	lc.local(id, func() {
		c.p.stats.Record(id, stats.OutcomeClientError)
		c.noreply = a.Noreply
		c.reply(wire.LineTooLarge)
	})
}

// keyVerbs names the commands of one key and no data sent upstream as they
// are; incr and decr go as meta arithmetic (wire.AppendArith).
var keyVerbs = [wire.NumCommands]string{wire.CmdDelete: "delete ", wire.CmdTouch: "touch "}

// keyCommand sends a delete, touch, incr or decr; one refused, or of a
// key no server can hold, is answered in its place (see
// refuseKeyCommand).
func (lc *loopClient) keyCommand(id int, w [][]byte) {
	key := w[1]
	noreply := bytes.Equal(w[len(w)-1], wire.NoreplyWord)
	var arg []byte
	var delta uint64
	// A request refused before memcached is asked anything (a key or
	// an argument the proxy does not take) is answered in its place.
	kc := lc.c.inspect(key)
	local := !lc.takes(key, kc)
	switch id {
	case wire.CmdDelete:
		local = local || !deleteForm(w)
	case wire.CmdTouch:
		// A fourth word other than noreply is ignored, as memcached does.
		exptime, ok := wire.ParseInt32(w[2])
		local = local || !ok
		arg = strconv.AppendInt(lc.c.scratch[:0], int64(exptime), 10)
		lc.c.scratch = arg
	case wire.CmdIncr, wire.CmdDecr:
		var ok bool
		if delta, ok = wire.ParseUint64(w[2]); !ok {
			local = true
		} else if enveloped := lc.c.envelopes(key, 0); !local && (enveloped || kc.rewrite) {
			// The number of an enveloped value is changed by a
			// read-modify-write (see modify).
			rk := lc.c.resolveChecked(key, postingsIf(enveloped), kc.rewrite)
			incr := id == wire.CmdIncr
			lc.modify(id, key, rk, noreply, nil, nil, func(c *conn, _ []byte) rmw { return c.arithOp(id, incr, delta) })
			return
		}
	}
	if local {
		lc.local(id, func() { lc.c.refuseKeyCommand(id, w) })
		return
	}
	up := lc.c.resolveChecked(key, 0, kc.rewrite).up
	lc.command(id, up, noreply, loopWrite{}, func(out []byte, tag uint32) []byte {
		if id == wire.CmdIncr || id == wire.CmdDecr {
			return wire.AppendArith(out, id == wire.CmdIncr, up, delta, tag)
		}
		return appendKeyCommand(out, keyVerbs[id], string(up), arg)
	})
	return
}

// command sends a command of one key whose reply is one line, which build
// appends, to key's server: with zones, in every zone at once, or zone
// after zone (see zoneByZone). A request to an ejected server fails at
// once. A storage command gives what its write counts.
func (lc *loopClient) command(id int, key []byte, noreply bool, w loopWrite, build func(out []byte, tag uint32) []byte) {
	lc.commandAs(id, id, nil, key, noreply, w, build)
}

// commandAs is command for a command that follows the zone rules of the
// classic write kind, and keeps its meta request, lm, if any, for its
// answer (see loopmeta.go).
func (lc *loopClient) commandAs(id, kind int, lm *loopMeta, key []byte, noreply bool, w loopWrite, build func(out []byte, tag uint32) []byte) {
	p := lc.c.p
	s := lc.ls.slot(lc, id)
	s.noreply, s.write, s.kind = noreply, w, kind
	if lm != nil {
		// The slot takes the request parsed; the loop parses the next
		// into the one the slot had, if any.
		s.takeMeta(lm)
		s.serial = lm.serial
	}
	s.ups = append(s.ups[:0], key...)
	lc.slots = append(lc.slots, s)
	lc.c.lastCmd.Store(s.began.UnixNano())
	// The write is marked, and the key's tier entry dropped, before it
	// goes upstream and again once it is answered (see writeguard).
	p.writingOf(key)
	if p.zoneByZone(kind) {
		// The request is kept, in the slot's arena, for the next zone.
		s.pending = 1
		s.arena = build(s.arena[:0], s.tag)
		s.tryZone(0)
		return
	}
	s.pending = len(p.zones)
	var req []byte // the request, as built for the first zone that takes it
	for _, z := range p.zones {
		u := lc.ls.upstreamOf(z.Up.Load(), key)
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

// expiresAtOnce reports whether memcached expires an item given exptime
// at once: a negative one, or a Unix time (past 30 days) not in the future.
func expiresAtOnce(exptime int32) bool {
	return exptime < 0 || exptime > wire.MaxRelativeTTL && int64(exptime) <= time.Now().Unix()
}

// refuseKeys refuses a whole retrieval, as memcached does, for a key it
// names that is not taken (memcached's 250 bytes, or with key settings
// --key-max-client-length and the bytes allowed): the refusal is counted
// by r, inspect's reason for the first such key, and answered
// CLIENT_ERROR.
func (c *conn) refuseKeys(id int, r keyspace.Reason) {
	c.countRefused(r)
	c.clientError(id, wire.LineBadFormat)
}

// seenScanMax is the most keys a retrieval looks for repeats of by
// scanning the keys grouped so far; a longer one keeps a map, which costs
// a hash and an insertion per key but does not grow with the keys.
const seenScanMax = 16
