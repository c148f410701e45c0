package proxy

import (
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
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
	used := c.groupKeys(keys)
	// The first server's share is fetched on this goroutine, the others'
	// alongside it.
	var wg sync.WaitGroup
	first := -1
	for s, call := range c.calls {
		if !used[s] {
			continue
		}
		if first < 0 {
			first = s
			continue
		}
		wg.Add(1)
		go func(co *coalescer, call *getCall) {
			defer wg.Done()
			co.get(call)
		}(c.p.servers[s].gets, call)
	}
	if first >= 0 {
		c.p.servers[first].gets.get(c.calls[first])
	}
	wg.Wait()
	return c.answerRetrieval(id, withCAS)
}

// getAndTouch answers gat and gats, whose first word is the new exptime.
// gomemcache has no multi-key gat and no gats, so these go through the
// server's extra connections, one request per server, concurrently.
func (c *conn) getAndTouch(words [][]byte, withCAS bool) error {
	id := cmdGat
	if withCAS {
		id = cmdGats
	}
	exptime, ok := parseInt32(words[0])
	if !ok {
		c.p.stats.record(id, outcomeClientError)
		c.reply(replyBadExptime)
		return nil
	}
	keys := words[1:]
	if !c.checkKeys(id, keys) {
		return nil
	}
	used := c.groupKeys(keys)
	var wg sync.WaitGroup
	for s, call := range c.calls {
		if !used[s] {
			continue
		}
		wg.Add(1)
		go func(srv *server, call *getCall) {
			defer wg.Done()
			found := make(map[string]*memcache.Item, len(call.keys))
			call.err = srv.extra.getAndTouch(exptime, call.keys, withCAS, func(it *memcache.Item) {
				found[it.Key] = it
			})
			for _, k := range call.keys {
				call.items = append(call.items, found[k])
			}
		}(c.p.servers[s], call)
	}
	wg.Wait()
	return c.answerRetrieval(id, withCAS)
}

// checkKeys refuses the whole request, as memcached does, when a key is
// longer than memcached allows.
func (c *conn) checkKeys(id int, keys [][]byte) bool {
	for _, k := range keys {
		if len(k) > keyMaxLength {
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
	for _, call := range c.calls {
		call.reset()
	}
	for _, k := range keys {
		key := string(k)
		c.keys = append(c.keys, key)
		if !forwardable(k) {
			// No server can hold such a key: it is always a miss.
			c.owners = append(c.owners, keyOwner{srv: -1})
			continue
		}
		s := c.serverFor(key)
		call := c.calls[s]
		c.owners = append(c.owners, keyOwner{srv: int32(s), pos: int32(len(call.keys))})
		call.keys = append(call.keys, key)
		used[s] = true
	}
	return used
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
	for _, call := range c.calls {
		if call.err != nil && len(call.keys) > 0 {
			c.p.upstreamFailed(call.err)
			if c.p.cfg.RetrievalFailure == failureError {
				st.record(id, outcomeUpstreamError)
				reply, _ := upstreamReply(call.err)
				c.reply(reply)
				return nil
			}
		}
	}
	touch := id == cmdGat || id == cmdGats
	for i, o := range c.owners {
		var it *memcache.Item
		if o.srv >= 0 {
			call := c.calls[o.srv]
			if call.err == nil {
				it = call.items[o.pos]
			}
		}
		if it == nil {
			st.recordKey(touch, false)
			continue
		}
		st.recordKey(touch, true)
		c.writeValue(c.keys[i], it, withCAS)
	}
	st.record(id, outcomeOK)
	c.wr.Write(replyEnd)
	return nil
}
