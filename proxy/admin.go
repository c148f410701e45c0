package proxy

import (
	"bytes"
	"strconv"
	"sync"
	"time"
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
	delta, ok := parseUint64(w[2])
	if !ok {
		return c.clientError(id, replyBadDelta)
	}
	up, bound, ok := c.upstreamKey(key)
	if !ok {
		c.p.stats.record(id, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(up)
	srv := c.up.servers[c.serverFor(k)]
	if bound || c.envelopes(key, 0) {
		return c.arithmeticEnveloped(id, srv, k, key, bound, incr, delta)
	}
	verb := "decr "
	if incr {
		verb = "incr "
	}
	c.req = appendKeyCommand(c.req[:0], verb, k, w[2])
	line, err := c.send(srv, c.req, nil)
	if err != nil {
		return c.upstreamError(id, srv, err)
	}
	c.answer(id, line)
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
	exptime, ok := parseInt32(w[2])
	if !ok {
		return c.clientError(cmdTouch, replyBadExptime)
	}
	up, _, ok := c.upstreamKey(key)
	if !ok {
		c.p.stats.record(cmdTouch, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(up)
	srv := c.up.servers[c.serverFor(k)]
	c.req = appendKeyCommand(c.req[:0], "touch ", k, strconv.AppendInt(c.scratch[:0], int64(exptime), 10))
	line, err := c.send(srv, c.req, nil)
	if err != nil {
		return c.upstreamError(cmdTouch, srv, err)
	}
	c.answer(cmdTouch, line)
	return nil
}

// delete answers delete. Like memcached it still takes the old "delete
// <key> 0" form, and nothing else after the key but noreply.
func (c *conn) delete(w [][]byte) error {
	if len(w) > 2 {
		holdZero := bytes.Equal(w[2], []byte("0"))
		c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
		valid := len(w) == 3 && (holdZero || c.noreply) || len(w) == 4 && holdZero && c.noreply
		if !valid {
			return c.clientError(cmdDelete, replyBadDeleteUsage)
		}
	}
	key := w[1]
	if !c.validKey(key) {
		return c.clientError(cmdDelete, replyBadFormat)
	}
	up, _, ok := c.upstreamKey(key)
	if !ok {
		c.p.stats.record(cmdDelete, outcomeNotFound)
		c.reply(replyNotFound)
		return nil
	}
	k := string(up)
	srv := c.up.servers[c.serverFor(k)]
	c.req = appendKeyCommand(c.req[:0], "delete ", k, nil)
	line, err := c.send(srv, c.req, nil)
	if err != nil {
		return c.upstreamError(cmdDelete, srv, err)
	}
	c.answer(cmdDelete, line)
	return nil
}

// flushAll sends flush_all, with the client's delay, to every server. It
// answers OK only when every server did.
func (c *conn) flushAll(w [][]byte) error {
	c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	var delay int32
	withDelay := false
	want := 1
	if c.noreply {
		want = 2
	}
	if len(w) != want {
		var ok bool
		if delay, ok = parseInt32(w[1]); !ok {
			return c.clientError(cmdFlushAll, replyBadExptime)
		}
		withDelay = true
	}
	errs := make([]error, len(c.up.servers))
	var wg sync.WaitGroup
	for i, s := range c.up.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = s.raw.flushAll(delay, withDelay)
			s.up.observe(start, errs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return c.upstreamError(cmdFlushAll, c.up.servers[i], err)
		}
	}
	c.p.stats.record(cmdFlushAll, outcomeOK)
	c.reply(replyOK)
	return nil
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
	if _, ok := parseUint32(w[1]); !ok {
		return c.clientError(cmdVerbosity, replyBadFormat)
	}
	c.p.stats.record(cmdVerbosity, outcomeOK)
	c.reply(replyOK)
	return nil
}

// stats answers the proxy's own counters; "stats reset" zeroes them.
// Subcommands about memcached's memory (items, slabs, settings…) belong to
// each upstream server and are answered ERROR.
func (c *conn) stats(w [][]byte) error {
	switch {
	case len(w) == 1:
		c.p.stats.record(cmdStats, outcomeOK)
		c.scratch = c.p.stats.appendStats(c.scratch[:0], c.p)
		c.wr.Write(c.scratch)
	case string(w[1]) == "reset":
		c.p.stats.reset()
		c.p.stats.record(cmdStats, outcomeOK)
		c.reply(replyReset)
	default:
		return c.clientError(cmdStats, replyError)
	}
	return nil
}

func (c *conn) clientError(id int, reply []byte) error {
	c.p.stats.record(id, outcomeClientError)
	c.reply(reply)
	return nil
}

// upstreamError answers a failed call to srv with memcached's reply for
// the cache outcome, or SERVER_ERROR for a failure.
func (c *conn) upstreamError(id int, srv *server, err error) error {
	reply, oc := upstreamReply(err)
	if oc == outcomeUpstreamError {
		srv.dropIdle(err)
	}
	c.p.stats.record(id, oc)
	c.reply(reply)
	return nil
}
