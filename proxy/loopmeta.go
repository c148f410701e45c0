package proxy

import (
	"bytes"
	"slices"
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// The meta writes, ms and md, on the loop. Each goes upstream as
// appendMetaStore makes it (md with its C, I and T), under the zone rules of the classic write it acts as (metaKind): a
// plain ms or md to every zone, ms in mode E as an add, one gated by a
// CAS value or a mode that needs the item zone after zone, the other
// zones brought in line after it took. Its answer is written from
// memcached's reply line by metaSetAnswer and metaAnswer, with the
// client's flags in its order.
//
// An ms that appends or prepends to an enveloped value, and ma on one,
// are read-modify-writes (see loopmodify.go).

// loopMeta is what an ms or md answered on the loop keeps until memcached
// answers: its request line, parsed, in a buffer of its own (the client's
// read buffer moves on), the request that brings the other zones in line
// after it took, and the reply line and answer made from it.
type loopMeta struct {
	req   metaReq
	line  []byte
	words [][]byte
	align []byte // nil: none
	// quietVivify: a quiet ma with N, asked without N first. serial: the
	// request may take another round trip (see loopSlot.serial).
	quietVivify, serial bool
	up                  []byte // memcached's reply line, which rep points into
	rep                 metaReply
	out                 []byte
	// An mg's search of the zones (see loopmetaget.go): its key's write
	// count, for a fill; whether N waits until no zone has the key, and
	// whether it was sent with N; the answer kept while the other zones
	// are asked, its error, server and zone.
	noted                uint64
	vivifyLast, vivified bool
	got                  []byte
	gotErr               error
	gotSrv               *upstream.Server
	gotZone              int
}

// metaReq is a meta request line as wire.ParseMeta read it, and what the
// sidecar learned of its key (see metaKey).
type metaReq struct {
	wire.Meta
	rk resolvedKey
}

// loopMetaKeep is the largest buffer a loopMeta keeps for the next
// request.
const loopMetaKeep = 4 << 10

// small reports whether m is worth keeping for the next request.
func (m *loopMeta) small() bool {
	return m != nil && cap(m.line) <= loopMetaKeep && cap(m.align) <= loopMetaKeep && cap(m.out) <= loopMetaKeep && cap(m.got) <= loopMetaKeep
}

// alignReq returns the request that brings the other zones in line, or
// nil; for a nil m, nil.
func (m *loopMeta) alignReq() []byte {
	if m == nil {
		return nil
	}
	return m.align
}

// takeMeta gives slot s the meta request lm, parsed into the loop's next
// loopMeta, and the loop the slot's spare for the one after. A slot keeps
// its request's loopMeta as a spare once it is given back, never as its
// meta: a classic command on the slot would take it for its own (an ms's
// request to bring the other zones in line, say).
func (s *loopSlot) takeMeta(lm *loopMeta) {
	s.meta, s.client.ls.meta, s.spareMeta = lm, s.spareMeta, nil
}

// parseMeta copies the words of a meta command line into the loop's next
// loopMeta and parses them there (see wire.ParseMeta).
func (ls *loopState) parseMeta(w [][]byte, limitKey bool) *loopMeta {
	lm := ls.meta
	if lm == nil {
		lm = new(loopMeta)
		ls.meta = lm
	}
	n := 0
	for _, x := range w {
		n += len(x)
	}
	lm.line, lm.words = slices.Grow(lm.line[:0], n), lm.words[:0]
	for _, x := range w {
		start := len(lm.line)
		lm.line = append(lm.line, x...) // never moves: grown to n
		lm.words = append(lm.words, lm.line[start:len(lm.line):len(lm.line)])
	}
	lm.req.rk = resolvedKey{}
	wire.ParseMeta(&lm.req.Meta, lm.words, limitKey)
	lm.align = lm.align[:0:0]
	lm.serial = false
	return lm
}

// metaKind is the classic write whose zone rules ms or md (id) follows:
// an add for mode E; one that goes zone after zone for a CAS value, and
// for an ms that replaces, appends or prepends; otherwise a set or
// delete, which every zone takes at once.
func metaKind(id int, m *metaReq) int {
	switch {
	case id == wire.CmdMetaDelete && m.HasCAS:
		return wire.CmdCas
	case id == wire.CmdMetaDelete:
		return wire.CmdDelete
	case m.Mode == 'E':
		return wire.CmdAdd
	case m.HasCAS:
		return wire.CmdCas
	case m.Mode == 'R':
		return wire.CmdReplace
	case m.Mode == 'A' || m.Mode == 'P':
		return wire.CmdAppend
	}
	return wire.CmdSet
}

// metaLocal answers, in its place among the replies owed, an ms or md
// refused or answered before anything is sent: with reply, counted as
// a client error, or by answer.
func (lc *loopClient) metaLocal(id int, reply []byte, answer func(c *conn)) {
	c := lc.c
	if c.mst == nil {
		c.mst = new(metaState)
	}
	lc.local(id, func() {
		if answer != nil {
			answer(c)
			return
		}
		c.p.stats.Record(id, stats.OutcomeClientError)
		c.wr.Write(reply)
	})
}

// metaDelete sends md. A key no server can hold, as the client sent it
// or in base64, is not found.
func (lc *loopClient) metaDelete(words [][]byte) {
	c := lc.c
	lm := lc.ls.parseMeta(words, c.p.keys == nil)
	m := &lm.req
	switch {
	case m.Err != nil:
		lc.metaLocal(wire.CmdMetaDelete, m.Err, nil)
		return
	case !c.validMetaKey(m):
		lc.metaLocal(wire.CmdMetaDelete, wire.LineBadFormat, nil)
		return
	}
	rk := c.lookup(m.Key, 0)
	m.SetWire(rk.up)
	if !rk.ok && !m.WireBin {
		// No server can hold such a key: nothing to delete.
		c.countRewrite(rk)
		lc.metaLocal(wire.CmdMetaDelete, nil, func(c *conn) {
			c.metaAnswer(wire.CmdMetaDelete, m, metaCodeNotFound, nil, nil)
		})
		return
	}
	c.countRewrite(rk)
	m.rk = rk
	kind := metaKind(wire.CmdMetaDelete, m)
	if kind == wire.CmdCas && len(c.p.zones) > 1 {
		lm.align = appendMetaHead(lm.align, "md ", string(rk.up), m.WireBin)
		lm.align = append(lm.align, wire.CRLF...)
	}
	lc.commandAs(wire.CmdMetaDelete, kind, lm, rk.up, false, loopWrite{}, func(out []byte, _ uint32) []byte {
		out = appendMetaHead(out, "md ", string(rk.up), m.WireBin)
		if m.HasCAS {
			out = append(out, " C"...)
			out = strconv.AppendUint(out, m.CAS, 10)
		}
		if m.Stale {
			out = append(out, " I"...)
		}
		if m.HasTTL {
			out = appendMetaFlag(out, 'T', int64(m.TTL))
		}
		return append(out, wire.CRLF...)
	})
	return
}

// metaSet sends ms, whose line is the lineLen bytes data begins with, and
// returns how many bytes of data it took, as store does. An append or
// prepend to an enveloped value is a read-modify-write (see modify).
func (lc *loopClient) metaSet(words [][]byte, data []byte, lineLen int) int {
	c := lc.c
	st := c.p.stats
	lm := lc.ls.parseMeta(words, c.p.keys == nil)
	m := &lm.req
	keyOK := true
	if m.Err == nil {
		keyOK, _ = c.checkMetaKey(m)
	}
	total := lineLen + m.Vlen + 2
	if m.Err != nil || !keyOK {
		// Refused before its block is read, which is dropped as it
		// comes, as memcached does when it read the block's length.
		if m.Err == nil {
			c.validMetaKey(m) // counts the refusal
		}
		st.CmdSet.Add(1)
		reply := m.Err
		if reply == nil {
			reply = wire.LineBadFormat
		}
		lc.metaLocal(wire.CmdMetaSet, reply, nil)
		if !m.VlenOK {
			return lineLen
		}
		return lc.dropBlock(total, data)
	}
	join := m.Mode == 'A' || m.Mode == 'P'
	flags := m.ClientFlags
	if join {
		flags = 0 // memcached keeps the item's flags
	}
	enveloped := c.envelopes(m.Key, flags)
	rk := c.lookup(m.Key, needTenant|postingsIf(enveloped))
	m.SetWire(rk.up)
	enveloped = enveloped || rk.bound
	if n, whole := lc.awaitBlock(total, data); !whole {
		return n
	}
	if !rk.ok && !m.WireBin {
		// As for set: no server can hold such a key as it is.
		st.CmdSet.Add(1)
		c.countRewrite(rk)
		lc.metaLocal(wire.CmdMetaSet, wire.LineBadFormat, nil)
		return total
	}
	m.rk = rk
	tenant := lc.countStore(rk)
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if m.Vlen > limit {
		lc.metaTooLarge(m, rk.up)
		return total
	}
	if !bytes.HasSuffix(data[:total], wire.CRLF) {
		lc.metaLocal(wire.CmdMetaSet, wire.LineBadChunk, nil)
		return total
	}
	value := data[lineLen : lineLen+m.Vlen]
	if enveloped && join {
		// Read, joined and written back (see loopmodify.go).
		if !wire.Forwardable(rk.up) {
			lc.metaLocal(wire.CmdMetaSet, nil, func(c *conn) { c.metaSetAnswer(m, metaCodeNotStore, nil) })
			return total
		}
		lc.modify(wire.CmdMetaSet, m.Key, rk, false, lm, value, func(c *conn, data []byte) rmw { return c.metaJoinOp(m, data) })
		return total
	}
	if enveloped {
		value, flags = c.encodeFor(m.Key, rk.bound, rk.postings, m.ClientFlags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			lc.metaTooLarge(m, rk.up)
			return total
		}
	}
	k := string(rk.up)
	kind := metaKind(wire.CmdMetaSet, m)
	if len(c.p.zones) > 1 {
		switch kind {
		case wire.CmdAdd, wire.CmdAppend:
			// The copies an add made where another zone held the key,
			// or the other zones' copies after an append or prepend.
			lm.align = append(appendMetaHead(lm.align, "md ", k, m.WireBin), wire.CRLF...)
		case wire.CmdCas, wire.CmdReplace:
			// The other zones get a set of the value stored.
			mode, hasCAS, stale := m.Mode, m.HasCAS, m.Stale
			m.Mode, m.HasCAS, m.Stale = 0, false, false
			lm.align = c.appendMetaStore(lm.align, k, m, flags, len(value), false)
			m.Mode, m.HasCAS, m.Stale = mode, hasCAS, stale
			lm.align = append(append(lm.align, value...), wire.CRLF...)
		}
	}
	w := loopWrite{tenant: tenant, size: len(value), enveloped: enveloped, logical: m.Vlen}
	lc.commandAs(wire.CmdMetaSet, kind, lm, rk.up, false, w, func(out []byte, _ uint32) []byte {
		out = c.appendMetaStore(out, k, m, flags, len(value), m.Has('c'))
		out = append(out, value...)
		return append(out, wire.CRLF...)
	})
	return total
}

// metaArithmetic sends ma, tagged as an incr is (see wire.MetaTagged),
// zone after zone as incr goes; on an enveloped value it is a
// read-modify-write (see modify).
func (lc *loopClient) metaArithmetic(words [][]byte) {
	c := lc.c
	lm := lc.ls.parseMeta(words, c.p.keys == nil)
	m := &lm.req
	switch {
	case m.Err != nil:
		lc.metaLocal(wire.CmdMetaArithmetic, m.Err, nil)
		return
	case !c.validMetaKey(m):
		lc.metaLocal(wire.CmdMetaArithmetic, wire.LineBadFormat, nil)
		return
	}
	enveloped := c.envelopes(m.Key, 0)
	rk := c.lookup(m.Key, postingsIf(enveloped))
	m.SetWire(rk.up)
	notFound := func(c *conn) { c.metaAnswer(wire.CmdMetaArithmetic, m, metaCodeNotFound, nil, nil) }
	if !rk.ok && !m.WireBin {
		c.countRewrite(rk)
		lc.metaLocal(wire.CmdMetaArithmetic, nil, notFound)
		return
	}
	c.countRewrite(rk)
	m.rk = rk
	if rk.bound || enveloped {
		// A read-modify-write (see loopmodify.go).
		if !wire.Forwardable(rk.up) {
			lc.metaLocal(wire.CmdMetaArithmetic, nil, notFound)
			return
		}
		lc.modify(wire.CmdMetaArithmetic, m.Key, rk, false, lm, nil, func(c *conn, _ []byte) rmw { return c.metaArithOp(m) })
		return
	}
	k := string(rk.up)
	if len(c.p.zones) > 1 {
		// The other zones drop their copy once one changed.
		lm.align = append(appendMetaHead(lm.align, "md ", k, m.WireBin), wire.CRLF...)
	}
	// memcached answers an ma that created its item even when asked
	// quietly. To know whether it will, a quiet ma with N asks without N
	// first and, only when the item is missing, again with it (see
	// retryVivify).
	lm.quietVivify = m.Quiet && m.HasVivify
	lm.serial = lm.quietVivify
	lc.commandAs(wire.CmdMetaArithmetic, wire.CmdIncr, lm, rk.up, false, loopWrite{}, func(out []byte, tag uint32) []byte {
		return appendTagged(out, c.metaArithmeticReq(m, k, !lm.quietVivify), tag)
	})
	return
}

// appendTagged appends meta request req with the opaque token O<tag>
// added.
func appendTagged(dst, req []byte, tag uint32) []byte {
	dst = append(dst, req[:len(req)-len(wire.CRLF)]...)
	dst = append(dst, " O"...)
	dst = strconv.AppendUint(dst, uint64(tag), 10)
	return append(dst, wire.CRLF...)
}

// retryVivify sends a quiet ma with N again, with N this time, when its
// first try found no item (see metaArithmetic), and reports whether it
// did: the reply to that one answers.
func (s *loopSlot) retryVivify(reply []byte, err error) bool {
	lm := s.meta
	if s.id != wire.CmdMetaArithmetic || !lm.quietVivify || err != nil || !bytes.HasPrefix(reply, metaCodeNotFound) {
		return false
	}
	lm.quietVivify = false
	m := &lm.req
	m.Quiet = false // it creates the item, or another client just did
	c := s.client.c
	s.arena = appendTagged(s.arena[:0], c.metaArithmeticReq(m, string(s.ups), true), s.tag)
	s.tryZone(0)
	return true
}

// dropBlock takes what is here of a refused request of total bytes, from
// the start of data, and has the rest dropped as it comes (see skip).
func (lc *loopClient) dropBlock(total int, data []byte) int {
	took := min(total, len(data))
	lc.skip = total - took
	return took
}

// metaTooLarge refuses an ms whose value is over the size limits:
// SERVER_ERROR in its place, once the item it would have replaced is
// deleted in every zone, whatever the mode (see tooLarge); the delete has
// no reply of its own.
func (lc *loopClient) metaTooLarge(m *metaReq, up []byte) {
	bin := m.WireBin
	lc.command(wire.CmdMetaDelete, up, true, loopWrite{refused: true}, func(out []byte, _ uint32) []byte {
		return append(appendMetaHead(out, "md ", string(up), bin), wire.CRLF...)
	})
	lc.metaLocal(wire.CmdMetaSet, wire.LineTooLarge, nil)
}

// metaAnswer answers an ms or md from memcached's reply line, or err.
func (s *loopSlot) metaAnswer(reply []byte, err error) {
	c, lm := s.client.c, s.meta
	if c.mst == nil {
		c.mst = new(metaState)
	}
	w := replyWriter{buf: lm.out[:0]}
	c.wr, c.noreply = &w, false
	if err != nil {
		line, oc := upstreamReply(err)
		c.p.stats.Record(s.id, oc)
		w.Write(line)
	} else {
		s.metaAnswerReply(reply)
	}
	c.wr = nil
	lm.out = w.buf
	if len(w.buf) > 0 {
		s.out = append(s.out, w.buf)
	}
}

// metaAnswerReply answers an ms, md or ma from memcached's whole reply:
// its line, and ma's number after it.
func (s *loopSlot) metaAnswerReply(reply []byte) {
	c, lm := s.client.c, s.meta
	m := &lm.req
	line := reply
	if i := bytes.IndexByte(reply, '\n'); i >= 0 {
		line = reply[:i+1]
	}
	lm.up = append(lm.up[:0], line...)
	r := &lm.rep
	if !r.parse(lm.up) {
		c.answer(s.id, lm.up) // memcached's own error line
		return
	}
	switch s.id {
	case wire.CmdMetaDelete:
		c.metaAnswer(wire.CmdMetaDelete, m, r.code[:], r, nil)
	case wire.CmdMetaArithmetic:
		switch r.code {
		case [2]byte{'V', 'A'}:
			c.metaAnswer(wire.CmdMetaArithmetic, m, metaCodeStored, r, reply[len(line):len(reply)-len(wire.CRLF)])
		case [2]byte{'H', 'D'}:
			c.metaAnswer(wire.CmdMetaArithmetic, m, metaCodeStored, r, nil)
		default:
			c.metaAnswer(wire.CmdMetaArithmetic, m, r.code[:], r, nil)
		}
	default:
		if r.code == [2]byte{'H', 'D'} {
			s.countWrite()
		}
		cas, _ := r.flag('c')
		c.metaSetAnswer(m, r.code[:], cas)
	}
}
