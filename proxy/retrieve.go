package proxy

import (
	"slices"
	"time"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// retrieve answers get and gets: keys are grouped by server, each group goes
// to that server's coalescer, and the VALUE lines come back in request
// order with the client's keys, duplicates repeated.
func (c *conn) retrieve(keys [][]byte, withCAS bool) error {
	id := cmdGet
	if withCAS {
		id = cmdGets
	}
	if !c.checkKeys(id, keys) {
		return nil
	}
	if withCAS {
		c.useTier(tierFill)
	} else {
		c.useTier(tierRead)
	}
	used := c.groupKeys(keys)
	c.fetchGroups(used)
	c.askOtherZones(upstream.Retrieval{})
	err := c.answerRetrieval(id, withCAS)
	c.fillLocal(upstream.Retrieval{})
	return err
}

// fetchGroups sends each used server's share of keys to its coalescer, on
// this goroutine, with no goroutine per server: the batches it leads are
// written first, all but one at once and that one as its replies are
// awaited, then read, that one first; then it waits for the servers where
// it stood in line. Reading them all before leading any batch in line
// keeps a server that is slow to hand over from holding up the replies
// already on their way.
func (c *conn) fetchGroups(used []bool) {
	servers := c.up.Servers
	only, n := -1, 0
	for s := range c.calls {
		if used[s] {
			only = s
			n++
		}
	}
	if n <= 1 {
		if only >= 0 {
			servers[only].Get(c.calls[only])
		}
		return
	}
	led := c.ledServers()
	first := -1 // the batch read first, written as its replies are awaited
	for s := range c.calls {
		if used[s] && servers[s].Begin(c.calls[s]) {
			led[s] = true
			first = s
		}
	}
	for s := range c.calls {
		if led[s] && s != first {
			c.calls[s].WriteNow()
		}
	}
	if first >= 0 {
		servers[first].End(c.calls[first], true)
	}
	for s := range c.calls {
		if led[s] && s != first {
			servers[s].End(c.calls[s], true)
		}
	}
	for s := range c.calls {
		if used[s] && !led[s] {
			servers[s].End(c.calls[s], false)
		}
	}
}

// ledServers returns a cleared per-server flag slice, reused across calls.
func (c *conn) ledServers() []bool {
	if cap(c.led) < len(c.calls) {
		c.led = make([]bool, len(c.calls))
	}
	c.led = c.led[:len(c.calls)]
	clear(c.led)
	return c.led
}

// getAndTouch answers gat and gats, whose first word is the new exptime.
// Each server's share goes out as one gats request, concurrently; these are
// not coalesced, since every request carries its own exptime.
func (c *conn) getAndTouch(words [][]byte, withCAS bool) error {
	id := cmdGat
	if withCAS {
		id = cmdGats
	}
	exptime, ok := wire.ParseInt32(words[0])
	if !ok {
		return c.clientError(id, replyBadExptime)
	}
	keys := words[1:]
	r := upstream.Retrieval{Touch: true, Exptime: exptime}
	c.useTier(tierDrop)
	for i, k := range keys {
		if !c.validKey(k) {
			// memcached touches the keys before the one it refuses.
			c.fetchAndTouch(r, keys[:i])
			c.askOtherZones(r)
			c.touchOtherZones(words[0])
			c.fillLocal(r)
			return c.clientError(id, replyBadFormat)
		}
	}
	c.fetchAndTouch(r, keys)
	c.askOtherZones(r)
	if expiresAtOnce(exptime) {
		// memcached expires the item as it answers the key the first
		// time: named again, it is a miss.
		for i := range c.owners {
			if c.owners[i].repeat && c.namedBefore(i) {
				c.owners[i].srv, c.owners[i].entry = -1, nil
			}
		}
	}
	err := c.answerRetrieval(id, withCAS)
	// Before the fill, which reuses the local zone's calls.
	c.touchOtherZones(words[0])
	c.fillLocal(r)
	return err
}

// namedBefore reports whether the client key of owner i was named earlier
// in the retrieval. A repeated upstream key may be another client key's
// (a rewrite equal to it), which memcached sees as a key of its own.
func (c *conn) namedBefore(i int) bool {
	return slices.Contains(c.keys[:i], c.keys[i])
}

// touchOtherZones touches, with exptime, each key a gat found in the
// zones that did not answer it (see touchZonesBut).
func (c *conn) touchOtherZones(exptime []byte) {
	if c.zs == nil || c.p.cfg.ZoneWrites == zoneWritesLocal {
		return
	}
	flushed := false
	for _, o := range c.owners {
		if o.srv < 0 || o.repeat {
			continue
		}
		if call := c.call(o); call.Err == nil && call.Items[o.pos].Hit {
			if !flushed {
				c.flush() // the client's reply first
				flushed = true
			}
			c.touchZonesBut(int(o.zone), call.Keys[o.pos], exptime)
		}
	}
}

// touchZonesBut touches upstream key k, with exptime, in every zone but z,
// which a gat found it in: a new time to live is a write, as a touch's is,
// and a copy that outlived it in another zone would answer a later read
// (one that expires at once would leave the item in every other zone).
// With --zone-writes=all, as every write; mg with T does the same with an
// mg (metaGet).
func (c *conn) touchZonesBut(z int, k string, exptime []byte) {
	c.alignReq = appendKeyCommand(c.alignReq[:0], "touch ", k, exptime)
	c.alignZones(z, k, c.alignReq, nil)
}

// expiresAtOnce reports whether memcached expires an item given exptime
// at once: a negative one, or a Unix time (past 30 days) not in the future.
func expiresAtOnce(exptime int32) bool {
	return exptime < 0 || exptime > wire.MaxRelativeTTL && int64(exptime) <= time.Now().Unix()
}

// fetchAndTouch sends each server's share of keys as one gats request,
// concurrently, and leaves the results in c.calls.
func (c *conn) fetchAndTouch(r upstream.Retrieval, keys [][]byte) {
	c.groupKeys(keys)
	fetchEach(c.up.Servers, c.calls, r)
}

// fetchEach sends every call that has keys to its server (calls[i] to
// servers[i]) as one request r, not coalesced, and returns when every call
// has its items. It writes every request before it reads any reply, on
// this goroutine, as fetchGroups does.
func fetchEach(servers []*upstream.Server, calls []*upstream.Call, r upstream.Retrieval) {
	first := -1 // the request read first, written as its replies are awaited
	for s, call := range calls {
		if len(call.Keys) == 0 {
			continue
		}
		servers[s].Send(r, call)
		if first >= 0 {
			calls[first].WriteNow()
		}
		first = s
	}
	if first < 0 {
		return
	}
	servers[first].Finish(r, calls[first])
	for s := range calls {
		if s != first && len(calls[s].Keys) > 0 {
			servers[s].Finish(r, calls[s])
		}
	}
}

// checkKeys refuses the whole request, as memcached does, when a key is
// longer than allowed (memcached's 250 bytes, or --key-max-client-length).
func (c *conn) checkKeys(id int, keys [][]byte) bool {
	for _, k := range keys {
		if !c.validKey(k) {
			c.p.stats.record(id, outcomeClientError)
			c.reply(replyBadFormat)
			return false
		}
	}
	return true
}

// groupKeys fills each server's call with its share of keys and records
// where every key's answer will be. It returns which servers have work.
func (c *conn) groupKeys(keys [][]byte) []bool {
	c.keys = c.keys[:0]
	c.owners = c.owners[:0]
	used := c.usedServers()
	if c.wr.refers() {
		// Replies not yet written refer to the arenas about to be reused.
		c.flush()
	}
	for _, call := range c.calls {
		call.Reset()
	}
	if len(keys) > seenScanMax {
		clear(c.seen)
	}
	need := needTenant
	if c.tierMode == tierRead || c.tierMode == tierFill {
		need |= needImmutable
	}
	for _, k := range keys {
		key := string(k)
		c.keys = append(c.keys, key)
		rk := c.resolve(k, need)
		tenant, bound := c.p.tenants.counters(rk.tenant), rk.bound
		if !rk.ok {
			// No server can hold such a key: it is always a miss.
			c.owners = append(c.owners, keyOwner{srv: -1, tenant: tenant})
			continue
		}
		if bound {
			key = string(rk.up)
		}
		e, gen := c.fromTier(k, key, rk.immutable)
		if e != nil {
			c.owners = append(c.owners, keyOwner{srv: -1, entry: e, tenant: tenant})
			continue
		}
		// An upstream key named again is fetched once and answered as
		// often as it was named, so repeating a large key costs one
		// copy, as in memcached. Two client keys may share an upstream
		// key (a rewrite equal to another client's key): each owner
		// checks the item against its own key.
		if len(keys) > 1 {
			if o, ok := c.named(key, len(keys)); ok {
				o.bound, o.tenant, o.immutable, o.repeat = bound, tenant, rk.immutable, true
				c.owners = append(c.owners, o)
				continue
			}
		}
		s := c.serverFor(key)
		call := c.calls[s]
		o := keyOwner{srv: int32(s), pos: int32(len(call.Keys)), bound: bound, immutable: rk.immutable, tenant: tenant, written: gen}
		c.owners = append(c.owners, o)
		call.Keys = append(call.Keys, key)
		used[s] = true
		if len(keys) > seenScanMax {
			if c.seen == nil {
				c.seen = make(map[string]keyOwner)
			}
			c.seen[key] = o
		}
	}
	return used
}

// seenScanMax is the most keys a retrieval looks for repeats of by
// scanning the keys grouped so far; a longer one keeps a map, which costs
// a hash and an insertion per key but does not grow with the keys.
const seenScanMax = 16

// named returns the owner of upstream key k if the retrieval being
// grouped, of n keys, already asks a server for it.
func (c *conn) named(k string, n int) (keyOwner, bool) {
	if n > seenScanMax {
		o, ok := c.seen[k]
		return o, ok
	}
	for _, o := range c.owners {
		if o.srv >= 0 && c.calls[o.srv].Keys[o.pos] == k {
			return o, true
		}
	}
	return keyOwner{}, false
}

// usedServers returns a cleared per-server flag slice, reused across calls.
func (c *conn) usedServers() []bool {
	if cap(c.used) < len(c.calls) {
		c.used = make([]bool, len(c.calls))
	}
	c.used = c.used[:len(c.calls)]
	clear(c.used)
	return c.used
}

// answerRetrieval writes the reply once every call has its items.
func (c *conn) answerRetrieval(id int, withCAS bool) error {
	st := c.p.stats
	oc := outcomeOK
	if c.p.cfg.RetrievalFailure == failureError {
		// A key whose last zone asked failed was not answered: the
		// whole request is an error.
		for _, o := range c.owners {
			if o.srv < 0 {
				continue
			}
			if call := c.call(o); call.Err != nil {
				st.record(id, outcomeUpstreamError)
				reply, _ := upstreamReply(call.Err)
				c.reply(reply)
				return nil
			}
		}
	}
	tally := keyTally{touch: id == cmdGat || id == cmdGats}
	refused := false
	for i, o := range c.owners {
		hit := false
		if e := o.entry; e != nil {
			c.writeValue(c.keys[i], e.Flags, 0, e.Value, withCAS, true)
			hit = true
		} else if o.srv >= 0 {
			call := c.call(o)
			if call.Err != nil {
				oc = outcomeUpstreamError // answered as a miss
			} else if call.Items[o.pos].Hit {
				it := &call.Items[o.pos]
				value, flags, ok := call.Value(int(o.pos)), it.Flags, true
				stable := true // the value is the arena's, not decoded
				switch {
				case o.bound && !c.p.codec.IsEnveloped(flags):
					// Under a rewritten key, a plain item is some
					// client's own value at an equal key: a miss.
					c.p.stats.keyUnbound.Add(1)
					ok = false
				case o.bound || c.p.codec != nil && c.p.codec.IsEnveloped(flags):
					c.keyBuf = append(c.keyBuf[:0], c.keys[i]...)
					value, flags, ok = c.open(c.ownerServer(o), c.keyBuf, call.Keys[o.pos], o.bound, flags, value)
					stable = false
				}
				if !ok {
					c.owners[i].refused, refused = true, true
				} else {
					c.writeValue(c.keys[i], flags, it.CAS, value, withCAS, stable)
					hit = true
					if c.tierMode != tierOff {
						c.keyBuf = append(c.keyBuf[:0], c.keys[i]...)
						c.keep(c.keyBuf, call.Keys[o.pos], o.written, o.immutable, value, flags, it.TTL)
					}
				}
			}
		}
		tally.add(o.tenant, hit)
	}
	tally.flush(st)
	if refused {
		c.missRefused()
	}
	st.record(id, oc)
	c.wr.Write(replyEnd)
	return nil
}

// missRefused marks as missed the items that every key asking for them
// refused, so that fillLocal does not store them into the local zone. An
// item two client keys share (a rewrite equal to another client's key)
// stays a hit when one of them took it.
func (c *conn) missRefused() {
	for _, o := range c.owners {
		if !o.refused {
			continue
		}
		taken := slices.ContainsFunc(c.owners, func(p keyOwner) bool {
			return !p.refused && p.entry == nil && p.zone == o.zone && p.srv == o.srv && p.pos == o.pos
		})
		if !taken {
			c.call(o).Items[o.pos].Hit = false
		}
	}
}
