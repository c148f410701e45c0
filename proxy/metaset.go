package proxy

// The meta commands that write an item or delete it: ms and md.

import (
	"bytes"
	"strconv"

	"mcsidecar/proxy/upstream"
)

// metaSet answers ms. As store does for the classic commands, the data
// block of a refused request is always consumed when its length was read.
func (c *conn) metaSet(w [][]byte) error {
	st := c.p.stats
	m := c.readMeta(w)
	keyOK := m.err != nil || c.validMetaKey(m)
	if m.err == nil && keyOK && c.awaitBlock(m.vlen+2) {
		return errNeedMore
	}
	st.cmdSet.Add(1)
	if m.err != nil || !keyOK {
		reply := m.err
		if reply == nil {
			reply = replyBadFormat
		}
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(reply)
		if m.vlenOK {
			return c.rd.discard(m.vlen + 2)
		}
		return nil
	}
	join := m.mode == 'A' || m.mode == 'P'
	flags := m.clientFlags
	if join {
		flags = 0 // memcached keeps the item's flags
	}
	enveloped := c.envelopes(m.key, flags)
	m.rk = c.resolve(m.key, needTenant|postingsIf(enveloped))
	up, bound := m.rk.up, m.rk.bound
	m.setWire(up)
	k := string(up)
	if !m.rk.ok && !m.bin {
		// As for set: no server can hold such a key as it is.
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(replyBadFormat)
		return c.rd.discard(m.vlen + 2)
	}
	tenant := c.p.tenants.counters(m.rk.tenant)
	if tenant != nil {
		tenant.requests.Add(1)
	}
	enveloped = enveloped || bound
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if m.vlen > limit {
		return c.metaTooLarge(k, m, m.vlen+2)
	}
	data, err := c.rd.data(m.vlen + 2)
	if err != nil {
		return err
	}
	if !bytes.HasSuffix(data, crlf) {
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(replyBadChunk)
		return nil
	}
	value := data[:m.vlen]
	if enveloped && join {
		if !forwardable(up) {
			return c.metaSetAnswer(m, metaCodeNotStore, nil)
		}
		c.keyBuf = append(c.keyBuf[:0], m.key...)
		return c.modifyInZones(k, func(srv *upstream.Server) error {
			return c.metaJoinEnveloped(m, srv, k, bound, value)
		})
	}
	if enveloped {
		c.keyBuf = append(c.keyBuf[:0], m.key...)
		value, flags = c.encodeFor(c.keyBuf, bound, m.rk.postings, m.clientFlags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			return c.metaTooLarge(k, m, 0)
		}
	}
	c.req = c.appendMetaStore(c.req[:0], k, m, flags, len(value), m.has('c'))
	var line []byte
	var srv *upstream.Server
	z := 0
	// As for the classic commands: add goes to every zone and stores
	// only where no zone holds the key; a write that takes only where
	// the item is as expected (replace, cas, append, prepend) goes zone
	// after zone until one takes it; a set goes to every zone.
	deciding := false
	switch {
	case m.mode == 'E':
		line, srv, err = c.sendAdd(k, c.req, value)
	case m.hasCAS || m.mode == 'R' || join:
		deciding = true
		line, z, srv, err = c.sendDeciding(k, c.req, value)
	default:
		line, srv, err = c.sendEvery(k, c.req, value)
	}
	if err != nil {
		return c.upstreamError(cmdMetaSet, srv, err)
	}
	r, ok := c.metaParse(line)
	if !ok {
		c.answer(cmdMetaSet, line)
		return nil
	}
	cas, _ := r.flag('c')
	if r.code == [2]byte{'H', 'D'} {
		if enveloped {
			c.countStored(m.vlen, len(value))
		}
		if tenant != nil {
			tenant.written.Add(uint64(len(value)))
		}
		switch {
		case join:
			c.metaAlignDelete(z, k, m.wireBin)
		case deciding && c.zs != nil:
			// The other zones get a set of the value stored.
			mode, hasCAS, stale := m.mode, m.hasCAS, m.stale
			m.mode, m.hasCAS, m.stale = 0, false, false
			c.alignReq = c.appendMetaStore(c.alignReq[:0], k, m, flags, len(value), false)
			m.mode, m.hasCAS, m.stale = mode, hasCAS, stale
			c.alignZones(z, k, c.alignReq, value)
		}
	}
	return c.metaSetAnswer(m, r.code[:], cas)
}

// appendMetaStore appends the ms line that stores a value of size bytes
// under k with the item flags given and the client's TTL, CAS, mode and
// invalidation; withCAS asks for the new CAS value back.
func (c *conn) appendMetaStore(dst []byte, k string, m *metaReq, flags uint32, size int, withCAS bool) []byte {
	dst = append(dst, "ms "...)
	if m.wireBin {
		dst = appendBase64(dst, []byte(k))
	} else {
		dst = append(dst, k...)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if m.wireBin {
		dst = append(dst, " b"...)
	}
	dst = appendMetaFlag(dst, 'F', int64(flags))
	if m.hasTTL {
		dst = appendMetaFlag(dst, 'T', int64(m.ttl))
	}
	if m.hasCAS {
		dst = append(dst, " C"...)
		dst = strconv.AppendUint(dst, m.cas, 10)
	}
	if m.mode != 0 {
		dst = append(dst, ' ', 'M', m.mode)
	}
	if m.stale {
		dst = append(dst, " I"...)
	}
	if withCAS {
		dst = append(dst, " c"...)
	}
	return append(dst, crlf...)
}

// metaSetAnswer answers ms with code and the client's return flags in its
// order; cas is the c flag's value. quiet hides HD only.
func (c *conn) metaSetAnswer(m *metaReq, code, cas []byte) error {
	oc := metaOutcome(code, outcomeStored)
	c.p.stats.record(cmdMetaSet, oc)
	if oc == outcomeStored && m.quiet {
		return nil
	}
	if cas == nil {
		cas = metaZero
	}
	out := append(c.mst.out[:0], code...)
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			out = appendMetaKey(out, m.key, m.bin)
		case 'c':
			out = append(append(out, " c"...), cas...)
		}
	}
	c.mst.out = append(out, crlf...)
	c.wr.Write(c.mst.out)
	return nil
}

// metaZero is the CAS value memcached returns when nothing was stored.
var metaZero = []byte("0")

// metaTooLarge refuses a value over the size limits as memcached does,
// dropping the item it would have replaced, whatever the mode, and
// consumes the n bytes of the data block still unread.
func (c *conn) metaTooLarge(k string, m *metaReq, n int) error {
	c.p.stats.record(cmdMetaSet, outcomeClientError)
	c.wr.Write(replyTooLarge)
	c.req = append(appendMetaHead(c.req[:0], "md ", k, m.wireBin), crlf...)
	c.sendEvery(k, c.req, nil)
	if n == 0 {
		return nil
	}
	return c.rd.discard(n)
}

// metaJoinEnveloped answers ms in append or prepend mode on a key whose
// values are enveloped, as joinEnveloped does for append and prepend: a
// missing item is NS (or, asked quietly by modifyInZones, no answer), a
// CAS the item no longer has is EX. The client key is in c.keyBuf.
func (c *conn) metaJoinEnveloped(m *metaReq, srv *upstream.Server, k string, bound bool, data []byte) error {
	return c.readModifyWrite(cmdMetaSet, srv, k, c.keyBuf, bound, m.rk.postings, c.metaJoinOp(m, data))
}

// metaJoinOp is the read-modify-write of ms m in append or prepend mode,
// of data.
func (c *conn) metaJoinOp(m *metaReq, data []byte) rmw {
	return rmw{
		missing: func() (bool, error) { return false, c.metaSetAnswer(m, metaCodeNotStore, nil) },
		change: func(old []byte, it *upstream.MetaItem) (bool, error) {
			if m.hasCAS && it.CAS != m.cas {
				return false, c.metaSetAnswer(m, metaCodeExists, nil)
			}
			c.join(m.mode == 'A', old, data)
			return true, nil
		},
		stored: func(notStored bool, cas uint64) (bool, error) {
			if notStored {
				return true, c.metaSetAnswer(m, metaCodeNotStore, nil)
			}
			return true, c.metaSetAnswer(m, metaCodeStored, strconv.AppendUint(c.scratch[:0], cas, 10))
		},
	}
}

// metaDelete answers md. A plain delete or invalidation reaches every
// zone; one gated by a CAS value is decided by the first zone that
// answers, and the others drop their copy when it took.
func (c *conn) metaDelete(w [][]byte) error {
	m, k, _, holdable, ok := c.metaOpen(cmdMetaDelete, w)
	if !ok {
		return nil
	}
	if !holdable {
		return c.metaAnswer(cmdMetaDelete, m, metaCodeNotFound, nil, nil)
	}
	c.req = appendMetaHead(c.req[:0], "md ", k, m.wireBin)
	if m.hasCAS {
		c.req = append(c.req, " C"...)
		c.req = strconv.AppendUint(c.req, m.cas, 10)
	}
	if m.stale {
		c.req = append(c.req, " I"...)
	}
	if m.hasTTL {
		c.req = appendMetaFlag(c.req, 'T', int64(m.ttl))
	}
	c.req = append(c.req, crlf...)
	var line []byte
	var srv *upstream.Server
	var err error
	z := 0
	if m.hasCAS {
		line, z, srv, err = c.sendDeciding(k, c.req, nil)
	} else {
		line, srv, err = c.sendEvery(k, c.req, nil)
	}
	if err != nil {
		return c.upstreamError(cmdMetaDelete, srv, err)
	}
	r, ok := c.metaParse(line)
	if !ok {
		c.answer(cmdMetaDelete, line)
		return nil
	}
	if m.hasCAS && r.code == [2]byte{'H', 'D'} {
		c.metaAlignDelete(z, k, m.wireBin)
	}
	return c.metaAnswer(cmdMetaDelete, m, r.code[:], r, nil)
}
