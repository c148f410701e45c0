package proxy

import (
	"bytes"
	"slices"
	"strconv"
)

// The meta writes, ms and md, on the loop. Each goes upstream as the
// goroutine path sends it (appendMetaStore, and md with its C, I and T),
// under the zone rules of the classic write it acts as (metaKind): a
// plain ms or md to every zone, ms in mode E as an add, one gated by a
// CAS value or a mode that needs the item zone after zone, the other
// zones brought in line after it took. Its answer is written from
// memcached's reply line by the goroutine path's own reply makers
// (metaSetAnswer, metaAnswer), with the client's flags in its order.
//
// An ms that appends or prepends to an enveloped value is a
// read-modify-write, still left to the goroutine path.

// loopMeta is what an ms or md answered on the loop keeps until memcached
// answers: its request line, parsed, in a buffer of its own (the client's
// read buffer moves on), the request that brings the other zones in line
// after it took, and the reply line and answer made from it.
type loopMeta struct {
	req   metaReq
	line  []byte
	words [][]byte
	align []byte // nil: none
	up    []byte // memcached's reply line, which rep points into
	rep   metaReply
	out   []byte
}

// loopMetaKeep is the largest buffer a loopMeta keeps for the next
// request.
const loopMetaKeep = 4 << 10

// small reports whether m is worth keeping for the next request.
func (m *loopMeta) small() bool {
	return m != nil && cap(m.line) <= loopMetaKeep && cap(m.align) <= loopMetaKeep && cap(m.out) <= loopMetaKeep
}

// alignReq returns the request that brings the other zones in line, or
// nil; for a nil m, nil.
func (m *loopMeta) alignReq() []byte {
	if m == nil {
		return nil
	}
	return m.align
}

// parseMeta copies the words of a meta command line into the loop's next
// loopMeta and parses them there (see parseMeta).
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
	parseMeta(&lm.req, lm.words, limitKey)
	lm.align = lm.align[:0:0]
	return lm
}

// metaKind is the classic write whose zone rules ms or md (id) follows:
// an add for mode E; one that goes zone after zone for a CAS value, and
// for an ms that replaces, appends or prepends; otherwise a set or
// delete, which every zone takes at once.
func metaKind(id int, m *metaReq) int {
	switch {
	case id == cmdMetaDelete && m.hasCAS:
		return cmdCas
	case id == cmdMetaDelete:
		return cmdDelete
	case m.mode == 'E':
		return cmdAdd
	case m.hasCAS:
		return cmdCas
	case m.mode == 'R':
		return cmdReplace
	case m.mode == 'A' || m.mode == 'P':
		return cmdAppend
	}
	return cmdSet
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
		c.p.stats.record(id, outcomeClientError)
		c.wr.Write(reply)
	})
}

// metaDelete sends md. It reports false for a key the loop cannot send as
// the goroutine path would (a binary key too long for base64), which is
// left to that path.
func (lc *loopClient) metaDelete(words [][]byte) bool {
	c := lc.c
	lm := lc.ls.parseMeta(words, c.p.keys == nil)
	m := &lm.req
	switch {
	case m.err != nil:
		lc.metaLocal(cmdMetaDelete, m.err, nil)
		return true
	case !c.validMetaKey(m):
		lc.metaLocal(cmdMetaDelete, replyBadFormat, nil)
		return true
	}
	rk := c.lookup(m.key, 0)
	m.setWire(rk.up)
	switch {
	case !rk.ok && !m.bin:
		// No server can hold such a key: nothing to delete.
		c.countRewrite(rk)
		lc.metaLocal(cmdMetaDelete, nil, func(c *conn) {
			c.metaAnswer(cmdMetaDelete, m, metaCodeNotFound, nil, nil)
		})
		return true
	case !rk.ok && !m.wireBin:
		return false
	}
	c.countRewrite(rk)
	m.rk = rk
	kind := metaKind(cmdMetaDelete, m)
	if kind == cmdCas && len(c.p.zones) > 1 {
		lm.align = appendMetaHead(lm.align, "md ", string(rk.up), m.wireBin)
		lm.align = append(lm.align, crlf...)
	}
	lc.commandAs(cmdMetaDelete, kind, lm, rk.up, false, loopWrite{}, func(out []byte, _ uint32) []byte {
		out = appendMetaHead(out, "md ", string(rk.up), m.wireBin)
		if m.hasCAS {
			out = append(out, " C"...)
			out = strconv.AppendUint(out, m.cas, 10)
		}
		if m.stale {
			out = append(out, " I"...)
		}
		if m.hasTTL {
			out = appendMetaFlag(out, 'T', int64(m.ttl))
		}
		return append(out, crlf...)
	})
	return true
}

// metaSet sends ms, whose line is the lineLen bytes data begins with, and
// returns how many bytes of data it took, as store does. It reports false
// for what it leaves to the goroutine path: an append or prepend to an
// enveloped value, and a key it cannot send as that path would.
func (lc *loopClient) metaSet(words [][]byte, data []byte, lineLen int) (int, bool) {
	c := lc.c
	st := c.p.stats
	lm := lc.ls.parseMeta(words, c.p.keys == nil)
	m := &lm.req
	keyOK := true
	if m.err == nil {
		keyOK, _ = c.checkMetaKey(m)
	}
	total := lineLen + m.vlen + 2
	if m.err != nil || !keyOK {
		// Refused before its block is read, which is dropped as it
		// comes, as memcached does when it read the block's length.
		if m.err == nil {
			c.validMetaKey(m) // counts the refusal
		}
		st.cmdSet.Add(1)
		reply := m.err
		if reply == nil {
			reply = replyBadFormat
		}
		lc.metaLocal(cmdMetaSet, reply, nil)
		if !m.vlenOK {
			return lineLen, true
		}
		return lc.dropBlock(total, data), true
	}
	join := m.mode == 'A' || m.mode == 'P'
	flags := m.clientFlags
	if join {
		flags = 0 // memcached keeps the item's flags
	}
	enveloped := c.envelopes(m.key, flags)
	rk := c.lookup(m.key, needTenant|postingsIf(enveloped))
	m.setWire(rk.up)
	enveloped = enveloped || rk.bound
	if enveloped && join || !rk.ok && m.bin && !m.wireBin {
		return 0, false
	}
	if n, whole := lc.awaitBlock(total, data); !whole {
		return n, true
	}
	if !rk.ok && !m.bin {
		// As for set: no server can hold such a key as it is.
		st.cmdSet.Add(1)
		c.countRewrite(rk)
		lc.metaLocal(cmdMetaSet, replyBadFormat, nil)
		return total, true
	}
	m.rk = rk
	tenant := lc.countStore(rk)
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if m.vlen > limit {
		lc.metaTooLarge(m, rk.up)
		return total, true
	}
	if !bytes.HasSuffix(data[:total], crlf) {
		lc.metaLocal(cmdMetaSet, replyBadChunk, nil)
		return total, true
	}
	value := data[lineLen : lineLen+m.vlen]
	if enveloped {
		value, flags = c.encodeFor(m.key, rk.bound, rk.postings, m.clientFlags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			lc.metaTooLarge(m, rk.up)
			return total, true
		}
	}
	k := string(rk.up)
	kind := metaKind(cmdMetaSet, m)
	if len(c.p.zones) > 1 {
		switch kind {
		case cmdAdd, cmdAppend:
			// The copies an add made where another zone held the key,
			// or the other zones' copies after an append or prepend.
			lm.align = append(appendMetaHead(lm.align, "md ", k, m.wireBin), crlf...)
		case cmdCas, cmdReplace:
			// The other zones get a set of the value stored.
			mode, hasCAS, stale := m.mode, m.hasCAS, m.stale
			m.mode, m.hasCAS, m.stale = 0, false, false
			lm.align = c.appendMetaStore(lm.align, k, m, flags, len(value), false)
			m.mode, m.hasCAS, m.stale = mode, hasCAS, stale
			lm.align = append(append(lm.align, value...), crlf...)
		}
	}
	w := loopWrite{tenant: tenant, size: len(value), enveloped: enveloped, logical: m.vlen}
	lc.commandAs(cmdMetaSet, kind, lm, rk.up, false, w, func(out []byte, _ uint32) []byte {
		out = c.appendMetaStore(out, k, m, flags, len(value), m.has('c'))
		out = append(out, value...)
		return append(out, crlf...)
	})
	return total, true
}

// dropBlock takes what is here of a refused request of total bytes, from
// the start of data, and has the rest dropped as it comes (see skip).
func (lc *loopClient) dropBlock(total int, data []byte) int {
	took := min(total, len(data))
	lc.skip = total - took
	return took
}

// metaTooLarge refuses an ms whose value is over the size limits, as the
// goroutine path does: SERVER_ERROR in its place, and the item it would
// have replaced deleted in every zone, whatever the mode, without a
// reply of its own.
func (lc *loopClient) metaTooLarge(m *metaReq, up []byte) {
	lc.metaLocal(cmdMetaSet, replyTooLarge, nil)
	bin := m.wireBin
	lc.command(cmdMetaDelete, up, true, loopWrite{refused: true}, func(out []byte, _ uint32) []byte {
		return append(appendMetaHead(out, "md ", string(up), bin), crlf...)
	})
}

// metaAnswer answers an ms or md from memcached's reply line, or err, as
// the goroutine path answers it.
func (s *loopSlot) metaAnswer(reply []byte, err error) {
	c, lm := s.client.c, s.meta
	if c.mst == nil {
		c.mst = new(metaState)
	}
	w := replyWriter{buf: lm.out[:0]}
	c.wr, c.noreply = &w, false
	switch {
	case err != nil:
		line, oc := upstreamReply(err)
		c.p.stats.record(s.id, oc)
		w.Write(line)
	default:
		lm.up = append(lm.up[:0], reply...)
		r := &lm.rep
		if !r.parse(lm.up) {
			c.answer(s.id, lm.up) // memcached's own error line
			break
		}
		if s.id == cmdMetaDelete {
			c.metaAnswer(cmdMetaDelete, &lm.req, r.code[:], r, nil)
			break
		}
		if r.code == [2]byte{'H', 'D'} {
			s.countWrite()
		}
		cas, _ := r.flag('c')
		c.metaSetAnswer(&lm.req, r.code[:], cas)
	}
	c.wr = nil
	lm.out = w.buf
	if len(w.buf) > 0 {
		s.out = append(s.out, w.buf)
	}
}
