package proxy

import (
	"sync"
	"testing"
	"time"
)

// TestOutOfStepRepliesReachNoOtherClient is issue 40's finding 1: memcached
// with a small read-buffer budget (-t 32 -o read_buf_mem_limit=1) answers
// a get it cannot buffer "SERVER_ERROR out of memory writing get
// response" and drops the replies it still owed to the requests before it
// on the connection. A proxy that takes each line as the reply of the next
// request in its queue is then out of step, and hands one client another
// client's replies. A forwarder delays memcached's replies by 30 ms, so
// that many requests pile up on the proxy's upstream connections, and a
// dozen clients pipeline sets, gets of up to 24 keys (memcached runs out
// from about 14 replies owed at once), deletes, touches, incrs and the
// rest of the isolation test's mix for 3 seconds; every reply is checked
// as there. Unless memcached ran out of memory at least once, the test
// tested nothing and fails.
func TestOutOfStepRepliesReachNoOtherClient(t *testing.T) {
	mc := startMemcached(t, "-t", "32", "-o", "read_buf_mem_limit=1")
	var delay faultConfig
	delay.rates[faultDelay] = 1
	delay.minDelay, delay.maxDelay = 30*time.Millisecond, 30*time.Millisecond
	fwd := startFaultForwarder(t, mc, 1, delay)
	_, addr := startProxy(t, testConfig(fwd.addr))

	shape := isoShape{maxBatch: 16, maxKeys: 24, dataKeys: 8}
	clients := make([]*isoClient, 12)
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for i := range clients {
		clients[i] = newIsoClient(i, 1, shape)
		wg.Go(func() { clients[i].run(addr, 1<<30, deadline) })
	}
	wg.Wait()
	reportIsoClients(t, clients)
	var sum isoClient
	for _, c := range clients {
		sum.replies += c.replies
		sum.errors += c.errors
		sum.hits += c.hits
		sum.redials += c.redials
		sum.foreign += c.foreign
	}
	t.Logf("%d replies checked (%d SERVER_ERROR, %d values), %d connections dialled again; memcached answered out of memory %d times; %d problems carry another client's bytes",
		sum.replies, sum.errors, sum.hits, sum.redials, fwd.oom.Load(), sum.foreign)
	if fwd.oom.Load() == 0 {
		t.Error("memcached never answered out of memory: the test did not make the condition it is about")
	}
}
