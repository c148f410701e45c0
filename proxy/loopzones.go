package proxy

import (
	"bytes"
	"slices"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

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
	if p.cfg.ZoneWrites == zones.WritesLocal {
		return true
	}
	switch id {
	case wire.CmdReplace, wire.CmdCas, wire.CmdAppend, wire.CmdPrepend, wire.CmdIncr, wire.CmdDecr:
		return true
	}
	return false
}

// tryZone sends the kept request of a write tried zone after zone to its
// key's server in zone z. It goes out with the other requests of the
// poll, in OnPollEnd.
func (s *loopSlot) tryZone(z int) { s.sendKept(z, cmdReplies[s.id]) }

// sendKept sends the request kept in the slot's arena, whose reply is of
// family expect, to its key's server in zone z.
func (s *loopSlot) sendKept(z int, expect wire.Reply) {
	ls := s.client.ls
	u := ls.upstreamOf(s.client.c.p.zones[z].Up.Load(), s.ups)
	r := ls.req(s)
	r.store, r.srv, r.expect = true, u.srv, expect
	s.reqs = append(s.reqs, r)
	s.zone = z
	if !u.admit(r) {
		return
	}
	u.out = append(u.out, s.arena...)
	u.q.push(r)
}

// decide takes zone s.zone's reply (or err) to a write tried zone after
// zone (add with --zone-writes=local too). It returns false when it sent the write
// to the next zone; otherwise the reply that answers the client: the
// first zone's that took the write (for add, that answered); when none
// did, the first zone's that answered, EXISTS if one said so; when none
// answered, the local zone's error (for add, the last zone's).
func (s *loopSlot) decide(r *loopReq, reply []byte, err error) (answer []byte, decided bool, _ error) {
	p := s.client.c.p
	z := s.zone
	r.err, r.buf = err, append(r.buf[:0], reply...)
	if s.kind == wire.CmdAdd {
		if err == nil {
			return r.buf, true, nil
		}
		p.zones[z].WriteFailures.Add(1)
	} else {
		if writeFailed(reply, err) {
			p.zones[z].WriteFailures.Add(1)
		}
		if err == nil {
			switch stats.ReplyOutcome(reply) {
			case stats.OutcomeStored, stats.OutcomeOK, stats.OutcomeClientError, stats.OutcomeUpstreamError:
				return r.buf, true, nil
			}
		}
	}
	if z+1 < len(p.zones) {
		s.tryZone(z + 1)
		return nil, false, nil
	}
	if s.kind == wire.CmdAdd {
		return r.buf, true, r.err
	}
	var first *loopReq
	for _, q := range s.reqs {
		if q.err == nil && (first == nil || stats.ReplyOutcome(q.buf) == stats.OutcomeExists && stats.ReplyOutcome(first.buf) != stats.OutcomeExists) {
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
		return q.err == nil && stats.ReplyOutcome(q.buf) == stats.OutcomeNotStored
	})
	if held < 0 {
		return reply
	}
	del := s.meta.alignReq() // an ms's md
	if del == nil {
		s.keys = appendKeyCommand(s.keys[:0], "delete ", string(s.ups), nil)
		del = s.keys
	}
	for z, q := range s.reqs {
		if q.err == nil && stats.ReplyOutcome(q.buf) == stats.OutcomeStored {
			s.alignZone(z, del, false)
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
	switch oc := stats.ReplyOutcome(reply); {
	case s.meta != nil:
		// An ms or md: the request made for it when it was sent.
		// An ma that took answers VA as well as HD.
		took := oc == stats.OutcomeStored || s.id == wire.CmdMetaArithmetic && oc == stats.OutcomeOK
		if req = s.meta.alignReq(); req == nil || !took {
			return
		}
		s.alignAll(req)
		return
	case (s.id == wire.CmdReplace || s.id == wire.CmdCas) && oc == stats.OutcomeStored:
		// The kept request, "<verb> <key> <flags> <exptime> <bytes>[ <cas>]"
		// and the value, as a set.
		line, value, _ := bytes.Cut(s.arena, wire.CRLF)
		words := bytes.Fields(line)
		req = append(s.keys[:0], "set"...)
		for _, w := range words[1:5] {
			req = append(append(req, ' '), w...)
		}
		req = append(append(req, wire.CRLF...), value...)
	case (s.id == wire.CmdAppend || s.id == wire.CmdPrepend) && oc == stats.OutcomeStored, (s.id == wire.CmdIncr || s.id == wire.CmdDecr) && oc == stats.OutcomeOK:
		req = appendKeyCommand(s.keys[:0], "delete ", string(s.ups), nil)
	default:
		return
	}
	s.keys = req
	s.alignAll(req)
}

// alignAll sends req to the key's server in every zone but s.zone (see
// alignZone).
func (s *loopSlot) alignAll(req []byte) {
	for z := range s.client.c.p.zones {
		if z != s.zone {
			s.alignZone(z, req, true)
		}
	}
}

// alignZone sends req to the key's server in zone z, and drops its reply,
// counting a failure against the zone when count says so. The slot's
// reply waits for it: a client told a write took finds no older copy in any zone.
func (s *loopSlot) alignZone(z int, req []byte, count bool) {
	u := s.client.ls.upstreamOf(s.client.c.p.zones[z].Up.Load(), s.ups)
	kind := uint8(dropUndo)
	if count {
		kind = dropAlign
	}
	if u.queueDropped(s, kind, z, wire.ReplyOf(req)) {
		u.out = append(u.out, req...)
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
	up := p.zones[z].Up.Load()
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
		o.gen = p.guard.Note(key) // for its fill
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
	zone.Reads[zones.Hit].Add(hits)
	zone.Reads[zones.Miss].Add(misses)
	zone.Reads[zones.Error].Add(errs)
	zone.ReadBytes.Add(size)
}

// fill stores the hits that other zones answered into the local zone, as
// memcached holds them (envelopes included), with an add and their
// remaining time to live: a value the local zone got meanwhile is newer,
// and stays. The adds go out in OnPollEnd. A fill that a write to its key
// through the sidecar raced is not sent, or deleted again (see
// writeguard).
func (s *loopSlot) fill() {
	p := s.client.c.p
	if s.zone == 0 || !p.cfg.ZoneFill {
		return
	}
	ls := s.client.ls
	up := p.zones[0].Up.Load()
	for i := range s.owners {
		o := &s.owners[i]
		if o.first != 0 || o.zone == 0 || o.block == nil || o.ttl == 0 {
			continue // a key gone in under a second is not worth it
		}
		key := s.upKey(i)
		if p.guard.WroteSince(key, o.gen) {
			p.fills[zones.FillDropped].Add(1)
			continue
		}
		u := ls.upstreamOf(up, key)
		r := u.dropReq(dropFill, 0, wire.ReplyStorage)
		r.key, r.gen = append(r.key, key...), o.gen
		if !u.pushDropped(nil, r) {
			continue
		}
		exptime := int32(wire.ExptimeOf(o.ttl))
		if s.touch {
			exptime = s.exptime // memcached tells the time to live before the touch
		}
		u.out = wire.AppendStorage(u.out, "add", string(key), o.flags, exptime, o.size, 0, false)
		u.out = append(append(u.out, o.stored()...), wire.CRLF...)
	}
}

// unfill deletes upstream key k from the local zone again, on u, for a
// fill that a write raced. The delete is a write of its own, so that no
// read keeps what it drops; its reply ends it (see countDropped).
func (u *loopUpstream) unfill(k []byte) {
	r := u.dropReq(dropUnfill, 0, wire.ReplyDelete)
	r.key = append(r.key, k...)
	u.ls.l.p.writingOf(k)
	if u.pushDropped(nil, r) {
		u.out = append(append(append(u.out, "delete "...), k...), wire.CRLF...)
	}
}

// zoned reports whether the proxy serves zones.
func (p *Proxy) zoned() bool { return len(p.zones) > 1 || p.zones[0].Name != "" }

// uniqueServers returns the current servers of every zone, each name once:
// DNS may name one server in two zones, and its metrics must be exported
// once.
func (p *Proxy) uniqueServers() []*upstream.Server {
	all := p.allServers()
	if len(p.zones) == 1 {
		return all
	}
	seen := make(map[string]bool, len(all))
	return slices.DeleteFunc(all, func(s *upstream.Server) bool {
		dup := seen[s.Name()]
		seen[s.Name()] = true
		return dup
	})
}

// allServers returns the current servers of every zone.
func (p *Proxy) allServers() []*upstream.Server {
	if len(p.zones) == 1 {
		return p.upstreams().Servers
	}
	var all []*upstream.Server
	for _, z := range p.zones {
		all = append(all, z.Up.Load().Servers...)
	}
	return all
}

// writeFailed reports whether a write did not take in its zone.
func writeFailed(line []byte, err error) bool { return err != nil || stats.IsServerError(line) }
