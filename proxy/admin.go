package proxy

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
	"time"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// arithmetic answers incr and decr.
func (c *conn) arithmetic(w [][]byte, incr bool) error {
	id := cmdDecr
	if incr {
		id = cmdIncr
	}
	c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	key := w[1]
	if !c.validKey(key) {
		return c.clientError(id, replyBadFormat)
	}
	delta, ok := wire.ParseUint64(w[2])
	if !ok {
		return c.clientError(id, replyBadDelta)
	}
	enveloped := c.envelopes(key, 0)
	rk := c.resolve(key, postingsIf(enveloped))
	if !rk.ok {
		c.p.stats.record(id, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(rk.up)
	if bound, postings := rk.bound, rk.postings; bound || enveloped {
		return c.modifyInZones(k, func(srv *upstream.Server) error {
			return c.arithmeticEnveloped(id, srv, k, key, bound, postings, incr, delta)
		})
	}
	verb := "decr "
	if incr {
		verb = "incr "
	}
	c.req = appendKeyCommand(c.req[:0], verb, k, w[2])
	line, z, srv, err := c.sendDeciding(k, c.req, nil)
	if err != nil {
		return c.upstreamError(id, srv, err)
	}
	if c.answer(id, line) == outcomeOK {
		c.alignDelete(z, k)
	}
	return nil
}

// appendKeyCommand appends "<verb><key>[ <arg>]\r\n"; verb ends in a
// space.
func appendKeyCommand(dst []byte, verb, key string, arg []byte) []byte {
	dst = append(dst, verb...)
	dst = append(dst, key...)
	if arg != nil {
		dst = append(dst, ' ')
		dst = append(dst, arg...)
	}
	return append(dst, crlf...)
}

// touch answers touch.
func (c *conn) touch(w [][]byte) error {
	c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	key := w[1]
	if !c.validKey(key) {
		return c.clientError(cmdTouch, replyBadFormat)
	}
	exptime, ok := wire.ParseInt32(w[2])
	if !ok {
		return c.clientError(cmdTouch, replyBadExptime)
	}
	rk := c.resolve(key, 0)
	if !rk.ok {
		c.p.stats.record(cmdTouch, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(rk.up)
	c.req = appendKeyCommand(c.req[:0], "touch ", k, strconv.AppendInt(c.scratch[:0], int64(exptime), 10))
	line, srv, err := c.sendEvery(k, c.req, nil)
	if err != nil {
		return c.upstreamError(cmdTouch, srv, err)
	}
	c.answer(cmdTouch, line)
	return nil
}

// deleteForm reports whether delete's words are a form memcached takes:
// the key, then "0" (the old hold time), noreply, or both in that order.
func deleteForm(w [][]byte) bool {
	holdZero := len(w) > 2 && bytes.Equal(w[2], []byte("0"))
	noreply := bytes.Equal(w[len(w)-1], noreplyWord)
	return len(w) == 2 || len(w) == 3 && (holdZero || noreply) || len(w) == 4 && holdZero && noreply
}

// delete answers delete. Like memcached it still takes the old "delete
// <key> 0" form, and nothing else after the key but noreply.
func (c *conn) delete(w [][]byte) error {
	if len(w) > 2 {
		c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
		if !deleteForm(w) {
			return c.clientError(cmdDelete, replyBadDeleteUsage)
		}
	}
	key := w[1]
	if !c.validKey(key) {
		return c.clientError(cmdDelete, replyBadFormat)
	}
	rk := c.resolve(key, 0)
	if !rk.ok {
		c.p.stats.record(cmdDelete, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(rk.up)
	c.req = appendKeyCommand(c.req[:0], "delete ", k, nil)
	line, srv, err := c.sendEvery(k, c.req, nil)
	if err != nil {
		return c.upstreamError(cmdDelete, srv, err)
	}
	c.answer(cmdDelete, line)
	return nil
}

// flushAll sends flush_all, with the client's delay, to every server. It
// answers OK only when every server did.
func (c *conn) flushAll(w [][]byte) error {
	var delay int32
	var withDelay, ok bool
	delay, withDelay, c.noreply, ok = parseFlushAll(w)
	if !ok {
		return c.clientError(cmdFlushAll, replyBadExptime)
	}
	// Reads that overlap it keep and fill nothing (see writeGuard).
	c.p.flushing(delay, withDelay)
	defer c.p.flushed()
	// Every server of every zone at once (of the local zone only with
	// --zone-writes=local). OK when every server of the local zone said
	// so, or, when one of those failed, every server of another zone.
	zones := c.p.flushZones()
	servers := make([][]*upstream.Server, len(zones))
	errs := make([][]error, len(zones))
	var wg sync.WaitGroup
	for z, zone := range zones {
		servers[z] = zone.up.Load().Servers
		errs[z] = make([]error, len(servers[z]))
		for i, s := range servers[z] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				errs[z][i] = s.FlushAll(delay, withDelay)
				s.Observe(start, errs[z][i])
			}()
		}
	}
	wg.Wait()
	answer := -1
	for z := range zones {
		failed := slices.ContainsFunc(errs[z], func(err error) bool { return err != nil })
		if failed && c.zs != nil {
			zones[z].writeFailures.Add(1)
		}
		if !failed && answer < 0 {
			answer = z
		}
	}
	if answer < 0 {
		for i, err := range errs[0] {
			if err != nil {
				return c.upstreamError(cmdFlushAll, servers[0][i], err)
			}
		}
	}
	c.p.stats.record(cmdFlushAll, outcomeOK)
	c.reply(replyOK)
	return nil
}

// parseFlushAll reads flush_all's words: an optional delay, then an
// optional noreply. ok is false for a delay memcached does not take.
func parseFlushAll(w [][]byte) (delay int32, withDelay, noreply, ok bool) {
	noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	want := 1
	if noreply {
		want = 2
	}
	if len(w) == want {
		return 0, false, noreply, true
	}
	delay, ok = wire.ParseInt32(w[1])
	return delay, true, noreply, ok
}

// quit closes the connection once earlier replies are written.
func (c *conn) quit([][]byte) error {
	c.p.stats.record(cmdQuit, outcomeOK)
	return errQuit
}

// version names the proxy.
func (c *conn) version([][]byte) error {
	c.p.stats.record(cmdVersion, outcomeOK)
	c.reply([]byte("VERSION " + c.p.version + "\r\n"))
	return nil
}

// verbosity is accepted and answered as memcached does; the proxy's own
// log level is a flag.
func (c *conn) verbosity(w [][]byte) error {
	c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	if _, ok := wire.ParseUint32(w[1]); !ok {
		return c.clientError(cmdVerbosity, replyBadFormat)
	}
	c.p.stats.record(cmdVerbosity, outcomeOK)
	c.reply(replyOK)
	return nil
}

// stats answers the proxy's own counters; "stats reset" zeroes them,
// "stats settings" lists the sidecar's settings and "stats conns" its
// client connections. The sidecar holds no items in slabs of its own (its
// items are in the upstream servers, whose stats tell about them), so
// "stats slabs", "stats items" and "stats sizes" answer as an empty
// memcached does. Other subcommands (detail, extstore…) are answered
// ERROR, as memcached answers one it does not know.
func (c *conn) stats(w [][]byte) error {
	sub := ""
	if len(w) > 1 {
		sub = string(w[1])
	}
	switch sub {
	case "":
		c.scratch = c.p.stats.appendStats(c.scratch[:0], c.p)
	case "reset":
		c.p.stats.reset()
		c.scratch = append(c.scratch[:0], replyReset...)
	case "settings":
		c.scratch = c.p.appendSettings(c.scratch[:0])
	case "conns":
		c.scratch = c.p.appendConns(c.scratch[:0])
	case "slabs":
		c.scratch = append(c.scratch[:0], "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n"...)
	case "items":
		c.scratch = append(c.scratch[:0], replyEnd...)
	case "sizes":
		c.scratch = append(c.scratch[:0], "STAT sizes_status disabled\r\nEND\r\n"...)
	default:
		return c.clientError(cmdStats, replyError)
	}
	c.p.stats.record(cmdStats, outcomeOK)
	c.wr.Write(c.scratch)
	return nil
}

func (c *conn) clientError(id int, reply []byte) error {
	c.p.stats.record(id, outcomeClientError)
	c.reply(reply)
	return nil
}

// upstreamError answers a failed call to srv with memcached's reply for
// the cache outcome, or SERVER_ERROR for a failure.
func (c *conn) upstreamError(id int, srv *upstream.Server, err error) error {
	reply, oc := upstreamReply(err)
	if oc == outcomeUpstreamError {
		srv.DropIdle(err)
	}
	c.p.stats.record(id, oc)
	c.reply(reply)
	return nil
}
