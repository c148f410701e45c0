package proxy

import (
	"bytes"
	"strconv"

	"mcsidecar/codec"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// rmwAttempts bounds the read-modify-write of append, prepend, incr and
// decr on an enveloped item: each attempt that loses a race against another
// write to the key (its cas is refused) starts over.
const rmwAttempts = 10

// envelopes reports whether a value stored under key with the client's
// flags is wrapped in an envelope.
func (c *conn) envelopes(key []byte, flags uint32) bool {
	cd := c.p.codec
	return cd != nil && (c.p.cfg.EnvelopeAll || cd.ShouldEnvelope(key, flags))
}

// encodeFor is encode for a key whose values may be raw postings lists,
// or not, as postingsKey would say.
func (c *conn) encodeFor(key []byte, bind, postings bool, flags uint32, value []byte) ([]byte, uint32) {
	var storedFlags uint32
	if postings {
		c.enc, storedFlags = c.p.codec.AppendEncodePostings(c.enc[:0], key, bind, flags, value)
	} else {
		c.enc, storedFlags = c.p.codec.AppendEncode(c.enc[:0], key, bind, flags, value)
	}
	return c.enc, storedFlags
}

// countStored adds an enveloped write to the byte counters.
func (c *conn) countStored(logical, stored int) {
	c.p.stats.CodecLogical.Add(uint64(logical))
	c.p.stats.CodecStored.Add(uint64(stored))
}

// openValue is open without the delete: damaged reports an envelope
// that is to be deleted (--codec-delete-corrupt), which the caller
// deletes.
func (c *conn) openValue(key []byte, bind bool, storedFlags uint32, stored []byte) (_ []byte, _ uint32, ok, damaged bool) {
	v, flags, err := c.p.codec.AppendDecode(c.dec[:0], key, bind, storedFlags, stored)
	if err != nil {
		r := codec.ReasonOf(err)
		c.p.stats.CodecRefused[r&15].Add(1)
		return nil, 0, false, r.Damaged() && c.p.cfg.Codec.DeleteCorrupt
	}
	c.p.stats.CodecReadLogical.Add(uint64(len(v)))
	c.p.stats.CodecReadStored.Add(uint64(len(stored)))
	c.dec = v
	return v, flags, true, false
}

// appendCreate appends the ms line that adds size bytes under k with
// flags and exptime, and asks for the item's CAS value.
func appendCreate(dst []byte, k string, size int, flags uint32, exptime int64) []byte {
	dst = append(append(dst, "ms "...), k...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	dst = appendMetaFlag(dst, 'F', int64(flags))
	dst = appendMetaFlag(dst, 'T', exptime)
	return append(dst, " ME c\r\n"...)
}

// joinOp is the read-modify-write of append or prepend (id) of data.
func (c *conn) joinOp(id int, data []byte) rmw {
	return rmw{
		missing: c.answerMissing(id, wire.LineNotStored, stats.OutcomeNotStored),
		change: func(old []byte, _ *upstream.MetaItem) bool {
			c.join(id == wire.CmdAppend, old, data)
			return true
		},
		stored: func(notStored bool, _ uint64) bool {
			if notStored {
				c.p.stats.Record(id, stats.OutcomeNotStored)
				c.reply(wire.LineNotStored)
				return true
			}
			c.p.stats.Record(id, stats.OutcomeStored)
			c.reply(wire.LineStored)
			return true
		},
	}
}

// arithOp is the read-modify-write of incr or decr (id) by delta.
func (c *conn) arithOp(id int, incr bool, delta uint64) rmw {
	var n uint64
	return rmw{
		missing: c.answerMissing(id, wire.LineNotFound, stats.OutcomeNotFound),
		change: func(old []byte, _ *upstream.MetaItem) bool {
			var ok bool
			if n, ok = c.count(old, incr, delta); !ok {
				c.clientError(id, wire.LineNonNumeric)
				return false
			}
			return true
		},
		stored: func(notStored bool, _ uint64) bool {
			if notStored {
				// A number always fits; refused, it was changed
				// meanwhile.
				return false
			}
			c.p.stats.Record(id, stats.OutcomeOK)
			c.replyNumber(n)
			return true
		},
	}
}

// join puts old with data joined after it (app) or before it in c.tmp.
func (c *conn) join(app bool, old, data []byte) {
	if app {
		c.tmp = append(append(c.tmp[:0], old...), data...)
	} else {
		c.tmp = append(append(c.tmp[:0], data...), old...)
	}
}

// count puts in c.tmp the counter old after incr or decr by delta, with
// memcached's arithmetic: incr wraps at 2^64, decr stops at 0, and a
// shorter result is padded with spaces to the old length, as memcached
// rewrites the number in place. ok is false when old is not a number.
func (c *conn) count(old []byte, incr bool, delta uint64) (n uint64, ok bool) {
	if n, ok = parseCounter(old); !ok {
		return 0, false
	}
	switch {
	case incr:
		n += delta
	case delta > n:
		n = 0
	default:
		n -= delta
	}
	c.tmp = strconv.AppendUint(c.tmp[:0], n, 10)
	for len(c.tmp) < len(old) {
		c.tmp = append(c.tmp, ' ')
	}
	return n, true
}

// rmw is one read-modify-write of an enveloped item: each function either
// goes on or answers the client itself.
type rmw struct {
	// missing answers a missing item, or asks to read it again (retry)
	// when it was created meanwhile.
	missing func() (retry bool)
	// create, when set, is asked first about a missing item: it returns
	// the value (with no flags) and exptime to create it with, by an add,
	// or false to leave the item to missing. created then answers the
	// item added, whose CAS value is cas; when another client created it
	// first, it is read again.
	create  func() (value []byte, exptime int64, ok bool)
	created func(cas uint64)
	// change puts the new value in c.tmp, and may change the item it is
	// written back as (its time to live). It returns false when it has
	// answered.
	change func(old []byte, it *upstream.MetaItem) bool
	// stored answers a write back that was not refused for a conflict
	// (notStored: memcached refused it otherwise; cas: the new item's
	// CAS value) and returns false to try again.
	stored func(notStored bool, cas uint64) bool
}

// answerMissing returns an rmw.missing that answers line with its outcome.
func (c *conn) answerMissing(id int, line []byte, oc stats.Outcome) func() bool {
	return func() bool {
		c.p.stats.Record(id, oc)
		c.reply(line)
		return false
	}
}

// parseCounter reads a value as memcached's incr and decr do: safe_strtoull
// over the item's data, a C string that ends at the first NUL (or, past
// the value, at the "\r\n" that follows it, which counts as white space).
func parseCounter(v []byte) (uint64, bool) {
	if i := bytes.IndexByte(v, 0); i >= 0 {
		v = v[:i]
	}
	return wire.ParseUint64(v)
}
