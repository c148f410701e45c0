package proxy

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/internal/writeguard"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// mg on the loop. It asks the key's server in the local zone and, while
// the answer is a miss or a failure, the other zones in order; with N and
// zones, the zones are asked
// without it first, and only when none has the key is the local zone asked
// again with it. The answer is made by metaGetAnswer.
// Then, with requests whose replies are dropped: a damaged envelope is
// deleted, a hit of another zone fills the local one, and a touch (T)
// reaches the other zones.

// metaGet sends mg, or me (id), which reads as mg does and is answered
// as memcached describes the item. A key no server can hold, as the
// client sent it or in base64, is a miss.
func (lc *loopClient) metaGet(id int, words [][]byte) {
	c := lc.c
	p := c.p
	lm := lc.ls.parseMeta(words, p.keys == nil)
	m := &lm.req
	switch {
	case m.Err != nil:
		lc.metaLocal(id, m.Err, nil)
		return
	case !c.validMetaKey(m):
		lc.metaLocal(id, wire.LineBadFormat, nil)
		return
	}
	need := uint8(0)
	if id == wire.CmdMetaGet {
		need = needTenant // counted, hit or miss
	}
	rk := c.lookup(m.Key, need)
	m.SetWire(rk.up)
	if !rk.ok && !m.WireBin {
		// No server can hold such a key: a miss.
		c.countRewrite(rk)
		lc.metaLocal(id, nil, func(c *conn) {
			if id == wire.CmdMetaDebug {
				c.p.stats.Record(wire.CmdMetaDebug, stats.OutcomeMiss)
				c.wr.Write(wire.LineMetaMiss)
				return
			}
			c.metaMiss(m)
		})
		return
	}
	c.countRewrite(rk)
	m.rk = rk
	s := lc.ls.slot(lc, id)
	s.takeMeta(lm)
	s.ups = append(s.ups[:0], rk.up...)
	lc.charge(s, lc.estimate(1))
	lc.slots = append(lc.slots, s)
	c.lastCmd.Store(s.began.UnixNano())
	lm.vivifyLast, lm.vivified = false, false
	lm.got, lm.gotErr, lm.gotSrv = lm.got[:0], nil, nil
	s.pending = 1
	if id == wire.CmdMetaDebug {
		s.arena = append(appendMetaHead(s.arena[:0], "me ", string(rk.up), m.WireBin), wire.CRLF...)
		s.tryZone(0)
		return
	}
	filling := len(p.zones) > 1 && p.cfg.ZoneFill
	lm.noted = 0
	if filling {
		lm.noted = p.guard.Note(rk.up)
	}
	if m.HasTTL {
		p.writingOf(rk.up) // a touch: the local tier's entry would outlive it
		lm.noted = writeguard.OwnWrite(lm.noted)
	}
	lm.vivifyLast = len(p.zones) > 1 && m.HasVivify
	s.serial = lm.vivifyLast
	// The request is kept, in the slot's arena, for the next zone.
	s.arena = c.appendMetaGet(s.arena[:0], string(rk.up), m, p.codec != nil, filling, !lm.vivifyLast)
	s.tryZone(0)
	return
}

// metaGot takes zone s.zone's reply to an mg or me, or err, from r.
func (s *loopSlot) metaGot(r *loopReq, reply []byte, err error) {
	p := s.client.c.p
	lm := s.meta
	z := s.zone
	if len(p.zones) == 1 || lm.vivified {
		s.metaGetDone(reply, err, r.srv, z)
		return
	}
	if err == nil && !bytes.HasPrefix(reply, metaCodeMiss) {
		s.metaGetDone(reply, nil, r.srv, z) // a hit, or memcached's error line
		return
	}
	// A miss or a failure: kept when it is the local zone's, or the first
	// answer after failures, to answer with if no zone has the key.
	if z == 0 || lm.gotErr != nil && err == nil {
		lm.got, lm.gotErr, lm.gotSrv, lm.gotZone = append(lm.got[:0], reply...), err, r.srv, z
	}
	if z+1 < len(p.zones) {
		s.tryZone(z + 1)
		return
	}
	if lm.vivifyLast && lm.gotErr == nil {
		// No zone has the key: the local zone creates it.
		m := &lm.req
		s.arena = s.client.c.appendMetaGet(s.arena[:0], string(s.ups), m, p.codec != nil, p.cfg.ZoneFill, true)
		lm.vivified = true
		s.tryZone(0)
		return
	}
	s.metaGetDone(lm.got, lm.gotErr, lm.gotSrv, lm.gotZone)
}

// metaGetDone answers an mg or me with the reply (or err) of srv, in zone
// from, that ends its search.
func (s *loopSlot) metaGetDone(reply []byte, err error, srv *upstream.Server, from int) {
	c := s.client.c
	p := c.p
	lm := s.meta
	m := &lm.req
	var line, value []byte
	if err == nil {
		line, value = reply, nil
		if i := bytes.IndexByte(reply, '\n'); i >= 0 && i+3 <= len(reply) {
			line, value = reply[:i+1], reply[i+1:len(reply)-2]
		}
	}
	if c.mst == nil {
		c.mst = new(metaState)
	}
	w := replyWriter{buf: lm.out[:0]}
	c.wr, c.noreply = &w, false
	var hit *metaReply
	var storedFlags uint32
	var damaged bool
	if s.id == wire.CmdMetaDebug {
		c.metaDebugAnswer(m, string(s.ups), reply, srv, err)
	} else {
		hit, storedFlags, damaged = c.metaGetAnswer(m, m.rk.bound, line, value, srv, err)
	}
	c.wr = nil
	lm.out = w.buf
	if len(w.buf) > 0 {
		s.out = append(s.out, w.buf)
	}
	s.client.made(s) // charged at its length now
	if m.HasTTL {
		p.wroteOf(s.ups)
		lm.noted = writeguard.OwnWriteEnded(lm.noted)
	}
	if damaged {
		s.deleteCorrupt(from, s.ups)
	}
	if hit != nil && from > 0 && p.cfg.ZoneFill {
		s.metaFill(hit, value, storedFlags)
	}
	if hit != nil && m.HasTTL && len(p.zones) > 1 && p.cfg.ZoneWrites != zones.WritesLocal {
		// The other zones get the new time to live, as for gat, by an
		// mg with T: the key in its wire form (base64 with b).
		req := appendMetaFlag(appendMetaHead(s.keys[:0], "mg ", string(s.ups), m.WireBin), 'T', int64(m.TTL))
		s.keys = append(req, wire.CRLF...)
		s.zone = from
		s.alignAll(s.keys)
	}
	s.release()
}

// metaFill stores a hit of another zone into the local one, with its
// remaining time to live, with a request whose reply is dropped (see
// fill).
func (s *loopSlot) metaFill(hit *metaReply, stored []byte, storedFlags uint32) {
	p := s.client.c.p
	lm := s.meta
	m := &lm.req
	exptime, ok := metaFillExptime(m, hit)
	if !ok {
		return
	}
	key := s.ups
	if p.guard.WroteSince(key, lm.noted) {
		p.fills[zones.FillDropped].Add(1)
		return
	}
	u := s.client.ls.upstreamOf(p.zones[0].Up.Load(), key)
	r := u.dropReq(dropFill, 0, wire.ReplyMetaSet)
	r.key, r.gen = append(r.key, key...), lm.noted
	if !u.pushDropped(nil, r) {
		return
	}
	u.out = appendMetaFill(u.out, string(key), m.WireBin, len(stored), storedFlags, exptime)
	u.out = append(append(u.out, stored...), wire.CRLF...)
}
