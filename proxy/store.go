package proxy

import (
	"bytes"
	"math"
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// store answers set, add, replace, append, prepend and cas. The checks run
// in memcached's order and answer with memcached's words. One deliberate
// difference: when the line names a usable length, a refused command's data
// block is always consumed, so the connection never falls out of step.
func (c *conn) store(id int, w [][]byte) error {
	st := c.p.stats
	a := parseStoreArgs(w, id == cmdCas)
	if c.p.keys != nil {
		a.ok = a.argsOK && c.validKey(a.key)
	}
	if a.ok && c.awaitBlock(a.vlen+2) {
		return errNeedMore
	}
	st.cmdSet.Add(1)
	c.noreply = a.noreply
	if !a.ok {
		st.record(id, outcomeClientError)
		c.reply(replyBadFormat)
		if a.lenOK {
			return c.rd.discard(a.vlen + 2)
		}
		return nil
	}
	key, vlen := a.key, a.vlen
	join := id == cmdAppend || id == cmdPrepend
	envFlags := a.flags
	if join {
		envFlags = 0 // memcached ignores the flags of append and prepend
	}
	enveloped := c.envelopes(key, envFlags)
	rk := c.resolve(key, needTenant|postingsIf(enveloped))
	tenant := c.p.tenants.counters(rk.tenant)
	if tenant != nil {
		tenant.requests.Add(1)
	}
	// key points into the read buffer, which data may move: k is a copy.
	k := string(rk.up)
	// A value under a rewritten key is always enveloped, bound to the
	// client key: another key may meet it upstream.
	bound, postings := rk.bound, rk.postings
	enveloped = enveloped || bound
	// A value to envelope may be over the item-size limit and still fit
	// once compressed; any other is stored as it is.
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if vlen > limit {
		return c.tooLarge(id, k, vlen+2)
	}
	if enveloped {
		c.keyBuf = append(c.keyBuf[:0], key...)
	}
	data, err := c.rd.data(vlen + 2)
	if err != nil {
		return err
	}
	if !bytes.HasSuffix(data, crlf) {
		st.record(id, outcomeClientError)
		c.reply(replyBadChunk)
		return nil
	}
	value, flags := data[:vlen], a.flags
	if enveloped && join {
		return c.modifyInZones(k, func(srv *upstream.Server) error {
			return c.joinEnveloped(id, srv, k, c.keyBuf, bound, postings, value)
		})
	}
	if enveloped {
		value, flags = c.encodeFor(c.keyBuf, bound, postings, a.flags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			return c.tooLarge(id, k, 0)
		}
	}
	c.req = appendStorage(c.req[:0], storageVerbs[id], k, flags, a.exptime, len(value), a.cas, id == cmdCas)
	var line []byte
	var srv *upstream.Server
	z := 0 // the zone whose reply answers
	switch id {
	case cmdSet:
		line, srv, err = c.sendEvery(k, c.req, value)
	case cmdAdd:
		line, srv, err = c.sendAdd(k, c.req, value)
	default:
		line, z, srv, err = c.sendDeciding(k, c.req, value)
	}
	if err != nil {
		return c.upstreamError(id, srv, err)
	}
	if c.answer(id, line) == outcomeStored {
		if enveloped {
			c.countStored(vlen, len(value))
		}
		if tenant != nil {
			tenant.written.Add(uint64(len(value)))
		}
		switch id {
		case cmdReplace, cmdCas:
			c.alignReq = appendStorage(c.alignReq[:0], "set", k, flags, a.exptime, len(value), 0, false)
			c.alignZones(z, k, c.alignReq, value)
		case cmdAppend, cmdPrepend:
			c.alignDelete(z, k)
		}
	}
	return nil
}

// storageVerbs names the storage commands upstream.
var storageVerbs = [numCommands]string{cmdSet: "set", cmdAdd: "add", cmdReplace: "replace", cmdAppend: "append", cmdPrepend: "prepend", cmdCas: "cas"}

// appendStorage appends the line of a storage command: "<verb> <key>
// <flags> <exptime> <bytes> [<cas>]". It never asks for noreply: on a
// connection shared by many clients every request is answered, so replies
// stay matched to requests; a client's noreply only drops the answer.
func appendStorage(dst []byte, verb, key string, flags uint32, exptime int32, size int, cas uint64, withCAS bool) []byte {
	dst = append(dst, verb...)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(flags), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(exptime), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if withCAS {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, cas, 10)
	}
	return append(dst, crlf...)
}

// tooLarge refuses a value over the size limits and consumes the n bytes
// of its data block still unread. k is the upstream key.
func (c *conn) tooLarge(id int, k string, n int) error {
	c.p.stats.record(id, outcomeClientError)
	c.reply(replyTooLarge)
	if id == cmdSet {
		// memcached drops the old value rather than keep serving it
		// after a set it could not store.
		c.req = appendKeyCommand(c.req[:0], "delete ", k, nil)
		c.sendEvery(k, c.req, nil)
	}
	if n == 0 {
		return nil
	}
	return c.rd.discard(n)
}

var noreplyWord = []byte("noreply")

// storeArgs are the arguments of a storage command line.
type storeArgs struct {
	key     []byte
	flags   uint32
	exptime int32
	vlen    int
	cas     uint64
	noreply bool
	lenOK   bool // the data block's length is known, so it can be consumed
	argsOK  bool // every argument but the key is valid
	ok      bool // every argument is valid, the key by memcached's own limits
}

// parseStoreArgs reads "<verb> <key> <flags> <exptime> <bytes> [<cas>]
// [noreply]" with memcached's rules. Keys it cannot forward fail here too.
func parseStoreArgs(w [][]byte, withCAS bool) storeArgs {
	var a storeArgs
	var okFlags, okExp, okCas bool
	var vlen int32
	a.key = w[1]
	a.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	a.flags, okFlags = wire.ParseUint32(w[2])
	a.exptime, okExp = wire.ParseInt32(w[3])
	vlen, a.lenOK = wire.ParseInt32(w[4])
	a.lenOK = a.lenOK && vlen >= 0 && vlen <= math.MaxInt32-2
	a.vlen = int(vlen)
	okCas = true
	if withCAS {
		a.cas, okCas = wire.ParseUint64(w[5])
	}
	a.argsOK = okFlags && okExp && a.lenOK && okCas
	a.ok = a.argsOK && len(a.key) <= keyMaxLength && forwardable(a.key)
	return a
}
