package proxy

import (
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/zones"
)

// getAndTouch sends a gat or gats (words: the verb, the new exptime, the
// keys) to the servers of its keys, one request per server, as retrieve
// sends a get; each request carries the exptime, so none joins a line.
// The keys' entries in the local tier are dropped (their time to live changes), and memcached's rules hold: a key
// the proxy refuses ends the request with CLIENT_ERROR once the keys
// before it are touched; with an exptime that expires the item at once, a
// key named again is a miss. With zones, the other zones are asked with
// mg and T (see askNextZone), and a key found is touched in the zones
// that did not answer it (see touchOtherZones).
func (lc *loopClient) getAndTouch(id int, words [][]byte) {
	c := lc.c
	p := c.p
	exptime, ok := wire.ParseInt32(words[1])
	keys := words[2:]
	bad, why, rewrites := lc.inspectAll(keys) // the first key refused, and why
	if !ok || bad == 0 {
		// Refused, or with no key at all, answered before memcached is
		// asked anything, in its place.
		lc.local(id, func() {
			switch {
			case !ok:
				c.clientError(id, wire.LineBadExptime)
			case len(keys) == 0:
				p.stats.Record(id, stats.OutcomeOK) // memcached answers no keys with END
				c.wr.Write(wire.LineEnd)
			default:
				c.countRefused(why) // keys[0]'s
				c.clientError(id, wire.LineBadFormat)
			}
		})
		return
	}
	if bad < len(keys) {
		c.countRefused(why)
	}
	keys = keys[:bad]
	ls := lc.ls
	s := ls.slot(lc, id)
	s.touch, s.exptime = true, exptime
	s.refuse = bad < len(words)-2
	s.expireNow = expiresAtOnce(exptime)
	lc.charge(s, lc.estimate(len(keys)))
	up := p.zones[0].Up.Load()
	var ups [4]*loopUpstream
	reqUps := ups[:0]
	var run stats.TenantRun
	defer run.End()
	for i, k := range keys {
		rk := c.resolveChecked(k, needTenant, rewrites[i])
		if p.tier != nil {
			p.tier.Delete(string(rk.up))
		}
		o, first := s.owner(k, i, len(keys), rk, &run)
		s.owners = append(s.owners, o)
		if first >= 0 || !rk.ok {
			continue // a key no server can hold is a miss
		}
		reqUps = s.group(reqUps, 0, ls.upstreamOf(up, rk.up), i)
	}
	reqUps = s.splitTouch(reqUps)
	lc.slots = append(lc.slots, s)
	c.lastCmd.Store(s.began.UnixNano())
	s.send(reqUps, 0, false)
	if s.pending == 0 {
		s.finish() // every request failed at once
	}
	return
}

// touchesZones reports whether s may yet give the other zones a new time
// to live once its reads are in: a gat or gats (see touchOtherZones), or
// an mg with T (see metaGetDone).
func (s *loopSlot) touchesZones() bool {
	return s.touch || s.id == wire.CmdMetaGet && s.meta != nil && s.meta.req.HasTTL
}

// touchOtherZones touches, with a gat's exptime, each key it found in the
// zones that did not answer it: a new time to live is a write, as a touch's is, and a copy that outlived it in another
// zone would answer a later read. The reply waits for the touches.
func (s *loopSlot) touchOtherZones() {
	p := s.client.c.p
	if !s.touch || len(p.zones) < 2 || p.cfg.ZoneWrites == zones.WritesLocal {
		return
	}
	exptime := strconv.AppendInt(nil, int64(s.exptime), 10)
	for i := range s.owners {
		o := &s.owners[i]
		if o.first != 0 || o.block == nil {
			continue // named before, or a miss
		}
		key := s.upKey(i)
		req := appendKeyCommand(nil, "touch ", string(key), exptime)
		for z := range p.zones {
			if z == o.zone {
				continue
			}
			u := s.client.ls.upstreamOf(p.zones[z].Up.Load(), key)
			if u.queueDropped(s, dropAlign, z, wire.ReplyOf(req)) {
				u.out = append(u.out, req...)
			}
		}
	}
}

// touchLineMax is the longest gat line memcached reads in pieces: with
// more than this buffered and no newline it hangs up (only get and gets
// lines may run longer), so a long gat goes as several lines.
const touchLineMax = 2048

// splitTouch splits each request of a gat, reqUps[i] the server of
// s.reqs[i], whose line would be longer than touchLineMax into requests
// of shorter lines to the same server, and returns reqUps for them all.
func (s *loopSlot) splitTouch(reqUps []*loopUpstream) []*loopUpstream {
	head := len("gats ") + len(strconv.Itoa(int(s.exptime))) + len(wire.CRLF)
	for ri := 0; ri < len(reqUps); ri++ {
		r := s.reqs[ri]
		n := head
		for j, i := range r.asked {
			if n += 1 + len(s.upKey(i)); n > touchLineMax && j > 0 {
				rest := s.client.ls.req(s)
				rest.asked = append(rest.asked, r.asked[j:]...)
				r.asked = r.asked[:j]
				s.reqs = append(s.reqs, rest)
				reqUps = append(reqUps, reqUps[ri])
				break
			}
		}
	}
	return reqUps
}
