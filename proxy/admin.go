package proxy

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// refuseKeyCommand answers, in its place, a delete, touch, incr or decr
// that the loop asks memcached nothing for (see keyCommand), with
// memcached's reply and in its order of checks: a delete form it does not
// take, a key the proxy refuses, a bad exptime or delta; otherwise the key
// is one no server can hold, which is not found.
func (c *conn) refuseKeyCommand(id int, w [][]byte) {
	if id != wire.CmdDelete || len(w) > 2 {
		c.noreply = bytes.Equal(w[len(w)-1], wire.NoreplyWord)
	}
	if id == wire.CmdDelete && !deleteForm(w) {
		c.clientError(id, wire.LineBadDeleteUsage)
		return
	}
	if !c.validKey(w[1]) {
		c.clientError(id, wire.LineBadFormat)
		return
	}
	switch id {
	case wire.CmdTouch:
		if _, ok := wire.ParseInt32(w[2]); !ok {
			c.clientError(id, wire.LineBadExptime)
			return
		}
	case wire.CmdIncr, wire.CmdDecr:
		if _, ok := wire.ParseUint64(w[2]); !ok {
			c.clientError(id, wire.LineBadDelta)
			return
		}
	}
	c.p.stats.Record(id, stats.OutcomeNotFound)
	c.reply(wire.LineNotFound)
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
	return append(dst, wire.CRLF...)
}

// deleteForm reports whether delete's words are a form memcached takes:
// the key, then "0" (the old hold time), noreply, or both in that order.
func deleteForm(w [][]byte) bool {
	holdZero := len(w) > 2 && bytes.Equal(w[2], []byte("0"))
	noreply := bytes.Equal(w[len(w)-1], wire.NoreplyWord)
	return len(w) == 2 || len(w) == 3 && (holdZero || noreply) || len(w) == 4 && holdZero && noreply
}

// parseFlushAll reads flush_all's words: an optional delay, then an
// optional noreply. ok is false for a delay memcached does not take.
func parseFlushAll(w [][]byte) (delay int32, withDelay, noreply, ok bool) {
	noreply = bytes.Equal(w[len(w)-1], wire.NoreplyWord)
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

// version names the proxy.
func (c *conn) version() {
	c.p.stats.Record(wire.CmdVersion, stats.OutcomeOK)
	c.reply([]byte("VERSION " + c.p.version + "\r\n"))
}

// verbosity is accepted and answered as memcached does; the proxy's own
// log level is a flag.
func (c *conn) verbosity(w [][]byte) {
	c.noreply = bytes.Equal(w[len(w)-1], wire.NoreplyWord)
	if _, ok := wire.ParseUint32(w[1]); !ok {
		c.clientError(wire.CmdVerbosity, wire.LineBadFormat)
		return
	}
	c.p.stats.Record(wire.CmdVerbosity, stats.OutcomeOK)
	c.reply(wire.LineOK)
}

// stats answers the proxy's own counters; "stats reset" zeroes them,
// "stats settings" lists the sidecar's settings and "stats conns" its
// client connections. The sidecar holds no items in slabs of its own (its
// items are in the upstream servers, whose stats tell about them), so
// "stats slabs", "stats items" and "stats sizes" answer as an empty
// memcached does. Other subcommands (detail, extstore…) are answered
// ERROR, as memcached answers one it does not know.
func (c *conn) stats(w [][]byte) {
	sub := ""
	if len(w) > 1 {
		sub = string(w[1])
	}
	switch sub {
	case "":
		c.scratch = c.p.stats.AppendStats(c.scratch[:0], stats.Info{
			Version: c.p.version, Servers: len(c.p.uniqueServers()), Codec: c.p.codec != nil, Keys: c.p.keys != nil,
			TierLimit: int64(c.p.cfg.LocalCacheSize),
		})
	case "reset":
		c.p.stats.Reset()
		c.scratch = append(c.scratch[:0], wire.LineReset...)
	case "settings":
		c.scratch = c.p.appendSettings(c.scratch[:0])
	case "conns":
		c.scratch = c.p.appendConns(c.scratch[:0], c)
	case "slabs":
		c.scratch = append(c.scratch[:0], "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n"...)
	case "items":
		c.scratch = append(c.scratch[:0], wire.LineEnd...)
	case "sizes":
		c.scratch = append(c.scratch[:0], "STAT sizes_status disabled\r\nEND\r\n"...)
	default:
		c.clientError(wire.CmdStats, wire.LineError)
		return
	}
	c.p.stats.Record(wire.CmdStats, stats.OutcomeOK)
	c.wr.Write(c.scratch)
}

func (c *conn) clientError(id int, reply []byte) {
	c.p.stats.Record(id, stats.OutcomeClientError)
	c.reply(reply)
}

// upstreamError answers a failed call to srv with memcached's reply for
// the cache outcome, or SERVER_ERROR for a failure.
func (c *conn) upstreamError(id int, srv *upstream.Server, err error) {
	reply, oc := upstreamReply(err)
	if oc == stats.OutcomeUpstreamError {
		srv.DropIdle(err)
	}
	c.p.stats.Record(id, oc)
	c.reply(reply)
}
