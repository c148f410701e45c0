package proxy

import (
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// getCall is one client request's share of keys on one server. A connection
// keeps one per server and reuses it, so a get costs no allocation here.
type getCall struct {
	keys  []string
	items []*memcache.Item // filled in key order; nil is a miss
	err   error
	done  chan struct{}
}

func newGetCall() *getCall { return &getCall{done: make(chan struct{}, 1)} }

func (c *getCall) reset() {
	c.keys = c.keys[:0]
	c.items = c.items[:0]
	c.err = nil
}

// coalescer turns the gets that many clients send to one server at the same
// time into few upstream multi-gets. A fixed number of workers each take a
// call, add every call already waiting (up to maxKeys keys), and fetch them
// in one request: under load one upstream round trip serves many clients,
// and with no load a call goes out at once.
type coalescer struct {
	client  cache
	queue   chan *getCall
	maxKeys int
	wg      sync.WaitGroup
}

func newCoalescer(client cache, workers, maxKeys int) *coalescer {
	co := &coalescer{client: client, queue: make(chan *getCall, 1024), maxKeys: maxKeys}
	co.wg.Add(workers)
	for range workers {
		go co.work()
	}
	return co
}

// submit queues call; its done channel is signalled when items and err are
// set.
func (co *coalescer) submit(call *getCall) { co.queue <- call }

func (co *coalescer) close() {
	close(co.queue)
	co.wg.Wait()
}

func (co *coalescer) work() {
	defer co.wg.Done()
	var batch []*getCall
	var keys []string
	for call := range co.queue {
		batch = append(batch[:0], call)
		keys = append(keys[:0], call.keys...)
	drain:
		for len(keys) < co.maxKeys {
			select {
			case more, ok := <-co.queue:
				if !ok {
					break drain
				}
				batch = append(batch, more)
				keys = append(keys, more.keys...)
			default:
				break drain
			}
		}
		found, err := co.client.GetMulti(keys)
		for _, c := range batch {
			c.err = err
			for _, k := range c.keys {
				c.items = append(c.items, found[k])
			}
			c.done <- struct{}{}
		}
		clear(batch)
		clear(keys)
	}
}
