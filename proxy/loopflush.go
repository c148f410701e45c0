package proxy

import (
	"bytes"
	"fmt"
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/zones"
)

// flushAll sends flush_all, with the client's delay, to every server of
// the zones it reaches (see flushZones), and answers once every server
// has. Reads that overlap it keep and fill
// nothing (see writeguard). A delay it does not take is refused in the
// reply's place.
func (lc *loopClient) flushAll(w [][]byte) {
	c, p := lc.c, lc.c.p
	delay, withDelay, noreply, ok := parseFlushAll(w)
	if !ok {
		lc.local(wire.CmdFlushAll, func() {
			c.noreply = noreply
			c.clientError(wire.CmdFlushAll, wire.LineBadExptime)
		})
		return
	}
	req := append(lc.c.scratch[:0], "flush_all"...)
	if withDelay {
		req = strconv.AppendInt(append(req, ' '), int64(delay), 10)
	}
	req = append(req, wire.CRLF...)
	lc.c.scratch = req
	p.flushing(delay, withDelay)
	s := lc.ls.slot(lc, wire.CmdFlushAll)
	s.noreply = noreply
	lc.slots = append(lc.slots, s)
	s.pending = 1 // until every request is sent: one may fail at once
	for z, zone := range p.flushZones() {
		for _, srv := range zone.Up.Load().Servers {
			u := lc.ls.upstream(srv)
			r := lc.ls.req(s)
			r.store, r.srv, r.zone, r.expect = true, srv, z, wire.ReplyOK
			s.reqs = append(s.reqs, r)
			s.pending++
			if u.admit(r) {
				u.out = append(u.out, req...)
				u.q.push(r)
			}
		}
	}
	s.flushedOne(nil, nil, nil)
}

// flushedOne takes one server's reply to flush_all (r nil: the sending is
// done), and answers once every server's is in: OK when every server of
// the local zone said so, or, when one of those failed, every server of
// another zone; otherwise the first failure of the local zone.
func (s *loopSlot) flushedOne(r *loopReq, reply []byte, err error) {
	p := s.client.c.p
	if r != nil {
		r.err, r.buf = err, append(r.buf[:0], reply...)
		if err == nil && stats.IsServerError(reply) {
			r.srv.CountServerError()
		}
	}
	if s.pending--; s.pending > 0 {
		return
	}
	p.flushed()
	failed := make([]*loopReq, len(p.flushZones())) // each zone's first failure
	for _, q := range s.reqs {
		if failed[q.zone] == nil && (q.err != nil || !bytes.Equal(q.buf, wire.LineOK)) {
			failed[q.zone] = q
		}
	}
	answer := -1
	for z, f := range failed {
		if f != nil && len(p.zones) > 1 {
			p.zones[z].WriteFailures.Add(1)
		}
		if f == nil && answer < 0 {
			answer = z
		}
	}
	s.pending = 1
	switch f := failed[0]; {
	case answer >= 0:
		p.stats.Record(wire.CmdFlushAll, stats.OutcomeOK)
		s.out = append(s.out, wire.LineOK)
	case f.err != nil:
		line, oc := upstreamReply(f.err)
		p.stats.Record(wire.CmdFlushAll, oc)
		s.out = append(s.out, line)
	default:
		// A line other than OK: memcached's own error line is relayed,
		// any other answered as a failed server, as on the goroutine
		// path, whose error quotes the line.
		line, oc := upstreamReply(fmt.Errorf("unexpected reply: %q", f.buf))
		p.stats.Record(wire.CmdFlushAll, oc)
		s.out = append(s.out, line)
	}
	s.release()
}

// flushZones are the zones flush_all reaches: every zone, or the local
// one only with --zone-writes=local.
func (p *Proxy) flushZones() []*zones.Zone {
	if p.cfg.ZoneWrites == zones.WritesLocal {
		return p.zones[:1]
	}
	return p.zones
}
