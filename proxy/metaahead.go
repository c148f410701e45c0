package proxy

import (
	"bytes"
	"slices"

	"mcsidecar/proxy/upstream"
)

// A client of the meta protocol pipelines its reads: many mg lines, often
// quiet, then an mn. Answered one at a time, each would wait for its own
// round trip. So when an mg is to be fetched, the mg lines the client sent
// right behind it, already read, are fetched with it in one go (as a
// multi-get's servers are), and each is answered from its fetch when its
// turn comes. Only plain reads of distinct keys are read ahead (see
// aheadable and readAhead): their replies do not depend on each other, and
// nothing the client sent between them writes. A fetch is used only by an
// mg whose upstream request is the very one fetched, to the same server,
// and what is left when another command comes, or when the connection has
// handled what it read, is dropped: a client never reads a value older
// than a command it sent before.

// How many mg are fetched in one go. The replies of a batch share one
// upstream deadline, as a multi-get's values do, so a batch is sized to
// hold about aheadBytes of values: the first of a connection holds
// aheadFirst lines, and each next one as many as the values seen so far
// fit, from 1 (nothing read ahead) to aheadMax. Pipelined reads of small
// values go 64 at a time; of 1 MB values, one at a time, as before.
const (
	aheadMax   = 64
	aheadFirst = 8
	aheadBytes = 256 << 10
)

// aheadKeep is the largest value buffer a fetch keeps for the next one
// while the connection works; once it waits for its client, it keeps
// none (see conn.park).
const aheadKeep = 64 << 10

// aheadFlags are the flags an mg read ahead may carry: none that writes
// (N, T, R, E), or whose answer depends on the reads before it (h, l), or
// that leaves the LRU as it is (u).
var aheadFlags = func() uint64 {
	var m uint64
	for _, b := range []byte("vftcskOqb") {
		m |= metaFlagBit(b)
	}
	return m
}()

// aheadable reports whether mg request m may be read ahead.
func aheadable(m *metaReq) bool {
	return m.verb == 'g' && m.err == nil && m.seen&^aheadFlags == 0
}

// metaAhead holds the mg requests fetched ahead, in the client's order,
// the next to be answered at next.
type metaAhead struct {
	calls []*upstream.Call
	srvs  []*upstream.Server
	led   []bool
	next  int
	pool  []*upstream.Call // calls to reuse
	reqs  [][]byte         // the requests' bytes, kept for the next fetch
	keys  []string         // the upstream keys of a batch being read ahead
	// The scratch of reading the lines ahead.
	words [][]byte
	req   metaReq
}

// drop forgets what was fetched and not answered.
func (a *metaAhead) drop() {
	if a == nil {
		return
	}
	for _, call := range a.calls {
		// Grown counts keys and batched calls, not bytes: shrink's bound.
		if cap(call.Arena) <= aheadKeep && cap(call.Reply) <= aheadKeep && !call.Grown(shrinkKeep) {
			call.Reset()
			a.pool = append(a.pool, call)
		}
	}
	clear(a.calls)
	clear(a.srvs)
	a.calls, a.srvs, a.next = a.calls[:0], a.srvs[:0], 0
}

// take returns the fetch of request req to srv when it is the next one.
// Anything else drops what is left.
func (a *metaAhead) take(srv *upstream.Server, req []byte) (*upstream.Call, bool) {
	if a.next < len(a.calls) && a.srvs[a.next] == srv && bytes.Equal(a.calls[a.next].Req, req) {
		a.next++
		return a.calls[a.next-1], true
	}
	a.drop()
	return nil, false
}

// add queues the request build appends to srv.
func (a *metaAhead) add(srv *upstream.Server, build func([]byte) []byte) {
	var call *upstream.Call
	if n := len(a.pool); n > 0 {
		call, a.pool = a.pool[n-1], a.pool[:n-1]
	} else {
		call = upstream.NewCall()
	}
	i := len(a.calls)
	if i == len(a.reqs) {
		a.reqs = append(a.reqs, nil)
	}
	a.reqs[i] = build(a.reqs[i][:0])
	call.Req = a.reqs[i]
	a.calls = append(a.calls, call)
	a.srvs = append(a.srvs, srv)
}

// fetch sends every queued request and waits for all their replies, the
// way a multi-get over several servers does: the leaders of batches
// first, then the requests that waited in line behind other batches.
func (a *metaAhead) fetch() {
	a.led = a.led[:0]
	first := -1
	for i, call := range a.calls {
		led := a.srvs[i].Begin(call)
		a.led = append(a.led, led)
		if led && first < 0 {
			first = i
		}
	}
	for i, call := range a.calls {
		if a.led[i] && i != first {
			call.WriteNow()
		}
	}
	if first >= 0 {
		a.srvs[first].End(a.calls[first], true)
	}
	for i, call := range a.calls {
		if a.led[i] && i != first {
			a.srvs[i].End(call, true)
		}
	}
	for i, call := range a.calls {
		if !a.led[i] {
			a.srvs[i].End(call, false)
		}
	}
}

// metaFetch is metaRead for the mg m being answered, whose upstream
// request is c.req: from what was read ahead when it was, and otherwise
// fetched together with the mg lines behind it (see readAhead).
func (c *conn) metaFetch(k string, m *metaReq) (line []byte, call *upstream.Call, srv *upstream.Server, from int, err error) {
	if c.zs != nil || !aheadable(m) {
		c.ahead.drop()
		return c.metaRead(k)
	}
	srv = c.up.Servers[c.serverFor(k)]
	if c.ahead == nil {
		c.ahead = new(metaAhead)
	}
	call, ok := c.ahead.take(srv, c.req)
	if !ok {
		c.readAhead(k, srv)
		call, _ = c.ahead.take(srv, c.req)
	}
	if call.Err == nil && isServerError(call.Reply) {
		srv.CountServerError()
	}
	return call.Reply, call, srv, 0, call.Err
}

// readAhead fetches, in one go, c.req to srv and the upstream requests of
// the mg lines already read behind the one being answered: consecutive
// plain reads (see aheadable) whose keys the proxy takes, each of a key
// none before it in the batch names, up to aheadMax. The requests go out
// on as many connections as a multi-get's, in no set order: an mg of a
// stale item changes it (the first to see it wins the right to refresh
// it), so two of one key must reach memcached in the client's order, and
// the second waits for its own turn. The lines are read as the commands
// will read them, without counting anything; each is answered, and
// counted, in its turn.
func (c *conn) readAhead(k string, srv *upstream.Server) {
	a := c.ahead
	a.drop()
	a.keys = append(a.keys[:0], k)
	a.add(srv, func(b []byte) []byte { return append(b, c.req...) })
	codec := c.p.codec != nil
	rest := c.rd.buf[c.rd.r:c.rd.w]
	if c.aheadWindow == 0 {
		c.aheadWindow = aheadFirst
	}
	for len(a.calls) < c.aheadWindow {
		i := bytes.IndexByte(rest, '\n')
		if i < 1 || rest[i-1] != '\r' {
			break
		}
		line := rest[:i-1]
		rest = rest[i+1:]
		if !bytes.HasPrefix(line, []byte("mg ")) || bytes.IndexByte(line, 0) >= 0 {
			break
		}
		words := a.words[:0]
		for len(line) > 0 && len(words) <= maxTokens {
			j := bytes.IndexByte(line, ' ')
			if j < 0 {
				j = len(line)
			}
			if j > 0 {
				words = append(words, line[:j])
			}
			line = line[min(j+1, len(line)):]
		}
		a.words = words
		if len(words) > maxTokens {
			break
		}
		m := &a.req
		parseMeta(m, words, c.p.keys == nil)
		if ok, _ := c.checkMetaKey(m); !aheadable(m) || !ok {
			break
		}
		m.rk = c.lookup(m.key, needTenant)
		if !m.rk.ok && !m.bin {
			break // answered without a fetch
		}
		if slices.Contains(a.keys, string(m.rk.up)) {
			break
		}
		m.setWire(m.rk.up)
		k := string(m.rk.up)
		a.keys = append(a.keys, k)
		a.add(c.up.Servers[c.serverFor(k)], func(b []byte) []byte {
			return c.appendMetaGet(b, k, m, codec, false, true)
		})
	}
	a.fetch()
	// The next batch holds what about aheadBytes of values like these
	// take.
	size := 0
	for _, call := range a.calls {
		size += len(call.Arena)
	}
	c.aheadWindow = aheadMax
	if size > 0 {
		c.aheadWindow = min(max(aheadBytes*len(a.calls)/size, 1), aheadMax)
	}
}
