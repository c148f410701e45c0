package upstream

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// coalescer turns the requests that many clients send to one server at the
// same time into few upstream writes and reads, without a goroutine of its
// own: gets become multi-gets and commands are pipelined beside them. Up to
// `leaders` calls fetch at once, each on its own client's goroutine; a call
// arriving while all are busy waits in line, and the next leader to finish
// hands the line over to the first waiter, which fetches everything that is
// waiting (up to maxKeys keys) in one request. With no load a call goes
// straight out; under load one round trip serves many clients.
type coalescer struct {
	pool    *rawPool
	up      *serverStats
	r       Retrieval // how gets are asked for: gets, or mg with the TTL
	leaders int
	maxKeys int

	mu      sync.Mutex
	active  int
	waiting []*Call
}

func newCoalescer(pool *rawPool, up *serverStats, leaders, maxKeys int) *coalescer {
	return &coalescer{pool: pool, up: up, leaders: leaders, maxKeys: maxKeys}
}

// get fills call.Items and call.Err.
func (co *coalescer) get(call *Call) {
	if keys, lead := co.take(call); lead {
		co.fetch(call, keys)
		return
	}
	if <-call.done == signalLead {
		co.lead(call)
	}
}

// take makes call a leader, its batch gathered, when fewer than leaders
// batches are in flight, and otherwise puts it in line. keys is how many
// keys a leader's batch asks for.
func (co *coalescer) take(call *Call) (keys int, lead bool) {
	co.mu.Lock()
	defer co.mu.Unlock()
	if co.active >= co.leaders {
		call.queued = time.Now()
		co.waiting = append(co.waiting, call)
		return 0, false
	}
	co.active++
	return co.gather(call), true
}

// lead fetches, for a call handed the lead, its keys and those of the
// calls waiting behind it.
func (co *coalescer) lead(call *Call) {
	co.mu.Lock()
	keys := co.gather(call)
	co.mu.Unlock()
	co.fetch(call, keys)
}

// fetch sends the work of every call of call's batch, in order, in one
// write: the keys of consecutive gets as one retrieval, commands as they
// are, and hands each call its items or its reply line.
func (co *coalescer) fetch(call *Call, keys int) {
	began := time.Now()
	co.settle(call, began, co.pool.exchange(co.r, call.batch), keys)
}

// settle ends call's lead of a batch of keys keys that began at began and
// ended with err: the batch is counted once, however many clients it
// served, each of its calls gets err, and the lead is handed over.
func (co *coalescer) settle(call *Call, began time.Time, err error, keys int) {
	co.up.observe(began, err)
	for _, c := range call.batch {
		c.Err = err
	}
	co.handOver(call, keys)
}

// begin starts call's fetch for a request that asks other servers too,
// without waiting for the reply, and reports whether call leads: a leader
// has its batch gathered on a connection, to be written by
// call.pend.writeNow or as end begins to read, and a call that must wait
// in line is queued. end completes it. A request over several servers
// writes to each before it reads from any, on its own goroutine, and
// costs no goroutine per server.
func (co *coalescer) begin(call *Call) bool {
	keys, lead := co.take(call)
	if !lead {
		return false
	}
	call.led = keys
	call.began = time.Now()
	call.pend = co.pool.send(co.r, call.batch)
	return true
}

// end completes what begin started: a leader reads its batch's replies
// and hands over; a call in line waits for its reply, or for its turn to
// lead.
func (co *coalescer) end(call *Call, led bool) {
	if !led {
		if <-call.done == signalLead {
			co.lead(call)
		}
		return
	}
	err := co.pool.finish(co.r, call.batch, call.pend)
	call.pend = pending{}
	co.settle(call, call.began, err, call.led)
}

// gather makes call.batch, with co.mu held: call, then the calls waiting
// in line while their keys fit. It returns how many keys the batch asks
// for.
func (co *coalescer) gather(call *Call) int {
	batch := append(call.batch[:0], call)
	keys := len(call.Keys)
	n := 0
	// Waiters join in order while their keys fit; one whose keys would
	// overflow the batch waits for the next, so a heavy request never
	// shares a deadline with light ones it was not already next to.
	for n < len(co.waiting) && keys+len(co.waiting[n].Keys) <= co.maxKeys && len(batch) < co.maxKeys {
		batch = append(batch, co.waiting[n])
		keys += len(co.waiting[n].Keys)
		n++
	}
	co.waiting = co.waiting[n:]
	call.batch = batch
	return keys
}

// handOver ends call's lead of a fetched batch of keys keys: it counts the
// batch, wakes the calls it served, and passes leadership on to the next
// waiter or gives the slot back.
func (co *coalescer) handOver(call *Call, keys int) {
	batch := call.batch
	// A batch refused because the server is ejected was never sent: it
	// counts as an ejected error only, as in the server's own counters.
	if keys > 0 && !errors.Is(call.Err, errEjected) {
		co.up.all.Gets.Add(1)
		co.up.all.GetKeys.Add(uint64(keys))
	}
	for _, c := range batch[1:] {
		c.done <- signalDone
	}
	clear(batch)
	call.batch = batch[:0]

	co.mu.Lock()
	// After a batch that failed, calls that have waited in line for
	// longer than the upstream timeout give up, unsent: otherwise, behind
	// a server that times out, the n-th call in line would wait n
	// timeouts. Behind a server that answers, a call in line is making
	// progress, and goes in the next batch however long the one before
	// took (a heavy one, or a proxy short of CPU). The line is in arrival
	// order, so they are at its front.
	expired := call.batch[:0]
	for call.Err != nil && len(co.waiting) > 0 && time.Since(co.waiting[0].queued) >= co.pool.timeout {
		expired = append(expired, co.waiting[0])
		co.waiting[0] = nil
		co.waiting = co.waiting[1:]
	}
	var next *Call
	if len(co.waiting) > 0 {
		next = co.waiting[0]
		co.waiting[0] = nil
		co.waiting = co.waiting[1:]
	} else {
		co.active--
		co.waiting = co.waiting[:0:0]
	}
	co.mu.Unlock()
	for _, c := range expired {
		c.Err = errQueueTimeout
		c.done <- signalDone
	}
	clear(expired)
	call.batch = expired[:0]
	if next != nil {
		next.done <- signalLead
	}
}

// errQueueTimeout fails a get that waited in line for its server longer
// than the upstream timeout. The client sees a timeout: a miss, or
// SERVER_ERROR upstream timeout.
var errQueueTimeout = fmt.Errorf("waited for a free upstream get longer than the upstream timeout: %w", os.ErrDeadlineExceeded)
