package proxy

import (
	"errors"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// getCall is one client request's share of keys on one server. A connection
// keeps one per server and reuses it, so a get costs no allocation here.
type getCall struct {
	keys  []string
	items []*memcache.Item // filled in key order; nil is a miss
	err   error
	done  chan signal

	// Scratch for when this call leads a batch.
	batch     []*getCall
	batchKeys []string
}

// signal tells a waiting call what happened to it.
type signal uint8

const (
	signalDone signal = iota // items and err are set
	signalLead               // fetch the next batch yourself
)

func newGetCall() *getCall { return &getCall{done: make(chan signal, 1)} }

func (c *getCall) reset() {
	c.keys = c.keys[:0]
	c.items = c.items[:0]
	c.err = nil
}

// coalescer turns the gets that many clients send to one server at the same
// time into few upstream multi-gets, without a goroutine of its own. Up to
// `leaders` calls fetch at once, each on its own client's goroutine; a call
// arriving while all are busy waits in line, and the next leader to finish
// hands the line over to the first waiter, which fetches everything that is
// waiting (up to maxKeys keys) in one request. With no load a call goes
// straight out; under load one round trip serves many clients.
type coalescer struct {
	client  cache
	stats   *stats
	leaders int
	maxKeys int

	mu      sync.Mutex
	active  int
	waiting []*getCall
}

func newCoalescer(client cache, st *stats, leaders, maxKeys int) *coalescer {
	return &coalescer{client: client, stats: st, leaders: leaders, maxKeys: maxKeys}
}

// get fills call.items and call.err.
func (co *coalescer) get(call *getCall) {
	co.mu.Lock()
	if co.active < co.leaders {
		co.active++
		co.mu.Unlock()
		co.lead(call)
		return
	}
	co.waiting = append(co.waiting, call)
	co.mu.Unlock()
	if <-call.done == signalLead {
		co.lead(call)
	}
}

// lead fetches call's keys and those of the calls waiting behind it, then
// passes leadership on to the next waiter or gives the slot back.
func (co *coalescer) lead(call *getCall) {
	batch := append(call.batch[:0], call)
	keys := append(call.batchKeys[:0], call.keys...)
	co.mu.Lock()
	n := 0
	for n < len(co.waiting) && len(keys) < co.maxKeys {
		batch = append(batch, co.waiting[n])
		keys = append(keys, co.waiting[n].keys...)
		n++
	}
	co.waiting = co.waiting[n:]
	co.mu.Unlock()

	co.fetch(batch, keys)
	for _, c := range batch[1:] {
		c.done <- signalDone
	}
	clear(batch)
	clear(keys)
	call.batch, call.batchKeys = batch[:0], keys[:0]

	co.mu.Lock()
	if len(co.waiting) > 0 {
		next := co.waiting[0]
		co.waiting[0] = nil
		co.waiting = co.waiting[1:]
		co.mu.Unlock()
		next.done <- signalLead
		return
	}
	co.active--
	co.waiting = co.waiting[:0:0]
	co.mu.Unlock()
}

// fetch gets keys from the server and hands each call its items. One key
// goes as a plain get, which spares gomemcache's per-call goroutine.
func (co *coalescer) fetch(batch []*getCall, keys []string) {
	co.stats.upstreamGets.Add(1)
	co.stats.upstreamGetKeys.Add(uint64(len(keys)))
	var found map[string]*memcache.Item
	var err error
	if len(keys) == 1 {
		var it *memcache.Item
		it, err = co.client.Get(keys[0])
		if errors.Is(err, memcache.ErrCacheMiss) {
			err = nil
		}
		for _, c := range batch {
			c.err = err
			for range c.keys {
				c.items = append(c.items, it)
			}
		}
		return
	}
	found, err = co.client.GetMulti(keys)
	for _, c := range batch {
		c.err = err
		for _, k := range c.keys {
			c.items = append(c.items, found[k])
		}
	}
}
