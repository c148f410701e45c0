package proxy

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"time"

	"mcsidecar/codec"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// rmwAttempts bounds the read-modify-write of append, prepend, incr and
// decr on an enveloped item: each attempt that loses a race against another
// write to the key (its cas is refused) starts over.
const rmwAttempts = 10

// backoff waits before a read-modify-write attempt that follows a lost
// race, a random while that grows with the attempts, so that writers that
// collided do not collide again in step.
func backoff(attempt int) {
	if attempt > 0 {
		time.Sleep(rand.N(time.Duration(attempt) * 100 * time.Microsecond))
	}
}

// envelopes reports whether a value stored under key with the client's
// flags is wrapped in an envelope.
func (c *conn) envelopes(key []byte, flags uint32) bool {
	cd := c.p.codec
	return cd != nil && (c.p.cfg.EnvelopeAll || cd.ShouldEnvelope(key, flags))
}

// encode wraps value in an envelope in the connection's buffer, and
// returns it with the flags to store upstream. bind stores the client key's
// binding, for a key stored under a rewritten upstream key. The result is
// valid until the next encode. It asks postingsKey about the key; a
// request that resolved its key calls encodeFor with the answer instead.
func (c *conn) encode(key []byte, bind bool, flags uint32, value []byte) ([]byte, uint32) {
	return c.encodeFor(key, bind, c.postingsKey(key), flags, value)
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

// postingsKey reports whether values under the client key may be raw
// postings lists, which the postings codec stores at a fraction of their
// size: the key starts with one of --codec-prefixes, or it matches a key
// scheme marked +postings. Under any other key the postings codec is never
// tried, so that no other value is stored differently.
func (c *conn) postingsKey(key []byte) bool {
	if c.p.codec.PostingsKey(key) {
		return true
	}
	if c.p.keys == nil {
		return false
	}
	s, ok := c.p.keys.SchemeOf(key)
	return ok && s.Postings
}

// countStored adds an enveloped write to the byte counters.
func (c *conn) countStored(logical, stored int) {
	c.p.stats.codecLogical.Add(uint64(logical))
	c.p.stats.codecStored.Add(uint64(stored))
}

// open verifies an enveloped item read for the client key (stored under
// the upstream key k, bound to key when bind) and returns
// the client's value and flags. The value sits in the connection's buffer
// until the next open. A refused envelope is counted by its reason, deleted
// upstream when it is damaged and --codec-delete-corrupt asks for it, and
// reported as not ok: the client sees a miss.
func (c *conn) open(srv *upstream.Server, key []byte, k string, bind bool, storedFlags uint32, stored []byte) ([]byte, uint32, bool) {
	v, flags, ok, damaged := c.openValue(key, bind, storedFlags, stored)
	if damaged {
		c.req = appendKeyCommand(c.req[:0], "delete ", k, nil)
		if line, err := c.send(srv, c.req, nil); err == nil && bytes.Equal(line, replyDeleted) {
			c.p.stats.codecDeleted.Add(1)
		}
	}
	return v, flags, ok
}

// openValue is open without the delete: damaged reports an envelope
// that is to be deleted (--codec-delete-corrupt), which the caller
// deletes.
func (c *conn) openValue(key []byte, bind bool, storedFlags uint32, stored []byte) (_ []byte, _ uint32, ok, damaged bool) {
	v, flags, err := c.p.codec.AppendDecode(c.dec[:0], key, bind, storedFlags, stored)
	if err != nil {
		r := codec.ReasonOf(err)
		c.p.stats.codecRefused[r&15].Add(1)
		return nil, 0, false, r.Damaged() && c.p.cfg.Codec.DeleteCorrupt
	}
	c.p.stats.codecReadLogical.Add(uint64(len(v)))
	c.p.stats.codecReadStored.Add(uint64(len(stored)))
	c.dec = v
	return v, flags, true, false
}

// readForUpdate reads key's item for a read-modify-write: the client's
// value and flags, and the item's CAS and time to live to write it back
// with. A missing item and a refused envelope are both not found, and so
// is, under a rewritten key (bind), an item that is no envelope.
func (c *conn) readForUpdate(srv *upstream.Server, k string, key []byte, bind bool) (value []byte, it upstream.MetaItem, found bool, err error) {
	start := time.Now()
	c.raw, it, found, err = srv.GetForUpdate(k, c.raw)
	srv.Observe(start, err)
	if err != nil || !found {
		return nil, it, false, err
	}
	if !c.p.codec.IsEnveloped(it.Flags) {
		if bind {
			// Some client's own value at a key equal to this
			// rewritten one: not ours.
			c.p.stats.keyUnbound.Add(1)
			return nil, it, false, nil
		}
		// A plain item under a key whose values are now enveloped, such
		// as one written before the codec was on.
		return c.raw, it, true, nil
	}
	value, it.Flags, found = c.open(srv, key, k, bind, it.Flags, c.raw)
	return value, it, found, nil
}

// createItem adds value, enveloped, under key with exptime, and reports
// whether it took, with the item's CAS value.
func (c *conn) createItem(srv *upstream.Server, k string, key []byte, bind, postings bool, value []byte, exptime int64) (cas uint64, took bool, err error) {
	stored, storedFlags := c.encodeFor(key, bind, postings, 0, value)
	c.alignReq = appendCreate(c.alignReq[:0], k, len(stored), storedFlags, exptime)
	line, err := c.send(srv, c.alignReq, stored)
	if err != nil || !bytes.HasPrefix(line, storedWithCAS) {
		return 0, false, err
	}
	cas, _ = wire.ParseUint64(bytes.TrimSuffix(line[len(storedWithCAS):], crlf))
	return cas, true, nil
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

// writeBack stores value, enveloped, under key if the item is still as it
// was read. conflict reports that another write came first; cas is the
// CAS value of the item stored, which the meta commands answer. postings
// is the key's resolvedKey.postings.
func (c *conn) writeBack(srv *upstream.Server, k string, key []byte, bind, postings bool, it upstream.MetaItem, value []byte) (conflict, notStored bool, cas uint64, err error) {
	stored, storedFlags := c.encodeFor(key, bind, postings, it.Flags, value)
	if len(stored) > int(c.p.cfg.MaxItemSize) {
		return false, true, 0, nil
	}
	it.Flags = storedFlags
	start := time.Now()
	conflict, notStored, cas, err = srv.StoreIfUnchanged(k, it, stored)
	srv.Observe(start, err)
	if err == nil && !conflict && !notStored {
		c.countStored(len(value), len(stored))
	}
	return conflict, notStored, cas, err
}

// joinEnveloped answers append and prepend on a key whose values are
// enveloped: memcached cannot join bytes to an envelope, so the client's
// data is joined to the decoded value. As in memcached, the item keeps its
// flags, a missing item is NOT_STORED, and so is a joined value over the
// item-size limit (memcached cannot allocate it).
func (c *conn) joinEnveloped(id int, srv *upstream.Server, k string, key []byte, bind, postings bool, data []byte) error {
	return c.readModifyWrite(id, srv, k, key, bind, postings, c.joinOp(id, data))
}

// joinOp is the read-modify-write of append or prepend (id) of data.
func (c *conn) joinOp(id int, data []byte) rmw {
	return rmw{
		missing: c.answerMissing(id, replyNotStored, outcomeNotStored),
		change: func(old []byte, _ *upstream.MetaItem) (bool, error) {
			c.join(id == cmdAppend, old, data)
			return true, nil
		},
		stored: func(notStored bool, _ uint64) (bool, error) {
			if notStored {
				c.p.stats.record(id, outcomeNotStored)
				c.reply(replyNotStored)
				return true, nil
			}
			c.p.stats.record(id, outcomeStored)
			c.reply(replyStored)
			return true, nil
		},
	}
}

// arithmeticEnveloped answers incr and decr on a key whose values are
// enveloped, with memcached's arithmetic (see count).
func (c *conn) arithmeticEnveloped(id int, srv *upstream.Server, k string, key []byte, bind, postings, incr bool, delta uint64) error {
	return c.readModifyWrite(id, srv, k, key, bind, postings, c.arithOp(id, incr, delta))
}

// arithOp is the read-modify-write of incr or decr (id) by delta.
func (c *conn) arithOp(id int, incr bool, delta uint64) rmw {
	var n uint64
	return rmw{
		missing: c.answerMissing(id, replyNotFound, outcomeNotFound),
		change: func(old []byte, _ *upstream.MetaItem) (bool, error) {
			var ok bool
			if n, ok = c.count(old, incr, delta); !ok {
				return false, c.clientError(id, replyNonNumeric)
			}
			return true, nil
		},
		stored: func(notStored bool, _ uint64) (bool, error) {
			if notStored {
				// A number always fits; refused, it was changed
				// meanwhile.
				return false, nil
			}
			c.p.stats.record(id, outcomeOK)
			c.replyNumber(n)
			return true, nil
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
	missing func() (retry bool, err error)
	// create, when set, is asked first about a missing item: it returns
	// the value (with no flags) and exptime to create it with, by an add,
	// or false to leave the item to missing. created then answers the
	// item added, whose CAS value is cas; when another client created it
	// first, it is read again.
	create  func() (value []byte, exptime int64, ok bool)
	created func(cas uint64) error
	// change puts the new value in c.tmp, and may change the item it is
	// written back as (its time to live). It returns false when it has
	// answered.
	change func(old []byte, it *upstream.MetaItem) (bool, error)
	// stored answers a write back that was not refused for a conflict
	// (notStored: memcached refused it otherwise; cas: the new item's
	// CAS value) and returns false to try again.
	stored func(notStored bool, cas uint64) (bool, error)
}

// answerMissing returns an rmw.missing that answers line with its outcome.
func (c *conn) answerMissing(id int, line []byte, oc outcome) func() (bool, error) {
	return func() (bool, error) {
		c.p.stats.record(id, oc)
		c.reply(line)
		return false, nil
	}
}

// readModifyWrite reads an enveloped item, lets op change it, and writes
// it back only if the item is unchanged, retrying a lost race up to
// rmwAttempts times. Asked quietly (c.quietMiss, by modifyInZones), a
// missing item answers nothing and sets c.missed, so that the next zone
// can be asked. c.changed reports that the value was stored.
func (c *conn) readModifyWrite(id int, srv *upstream.Server, k string, key []byte, bind, postings bool, op rmw) error {
	c.changed = false
	for attempt := range rmwAttempts {
		backoff(attempt)
		old, it, found, err := c.readForUpdate(srv, k, key, bind)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		if !found && c.quietMiss {
			c.missed = true
			return nil
		}
		if !found && op.create != nil {
			if value, exptime, ok := op.create(); ok {
				cas, took, err := c.createItem(srv, k, key, bind, postings, value, exptime)
				if err != nil {
					return c.upstreamError(id, srv, err)
				}
				if took {
					c.changed = true
					return op.created(cas)
				}
				continue // another client created it first
			}
		}
		if !found {
			if retry, err := op.missing(); !retry {
				return err
			}
			continue
		}
		if goOn, err := op.change(old, &it); !goOn {
			return err
		}
		conflict, notStored, cas, err := c.writeBack(srv, k, key, bind, postings, it, c.tmp)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		if conflict {
			continue
		}
		if done, err := op.stored(notStored, cas); done {
			c.changed = !notStored
			return err
		}
	}
	c.p.stats.record(id, outcomeUpstreamError)
	c.reply(replyContended)
	return nil
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
