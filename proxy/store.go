package proxy

import (
	"bytes"
	"math"
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
	tenant := c.tenantOf(key)
	if tenant != nil {
		tenant.requests.Add(1)
	}
	// key points into the read buffer, which data may move: k is a copy.
	up, bound, _ := c.upstreamKey(key)
	k := string(up)
	// A value under a rewritten key is always enveloped, bound to the
	// client key: another key may meet it upstream.
	enveloped := bound
	switch {
	case bound:
	case join:
		// memcached ignores the flags of append and prepend.
		enveloped = c.envelopes(key, 0)
	default:
		enveloped = c.envelopes(key, a.flags)
	}
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
		return c.joinEnveloped(id, c.up.servers[c.serverFor(k)], k, c.keyBuf, bound, value)
	}
	if enveloped {
		value, flags = c.encode(c.keyBuf, bound, a.flags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			return c.tooLarge(id, k, 0)
		}
	}
	c.item.Key = k
	c.item.Value = value
	c.item.Flags = flags
	c.item.Expiration = a.exptime
	c.item.CasID = a.cas
	srv := c.up.servers[c.serverFor(k)]
	switch id {
	case cmdSet:
		err = srv.client.Set(&c.item)
	case cmdAdd:
		err = srv.client.Add(&c.item)
	case cmdReplace:
		err = srv.client.Replace(&c.item)
	case cmdAppend:
		err = srv.client.Append(&c.item)
	case cmdPrepend:
		err = srv.client.Prepend(&c.item)
	case cmdCas:
		err = srv.client.CompareAndSwap(&c.item)
	}
	if err != nil && id == cmdSet && isConnError(err) {
		// A set is safe to repeat: after a server restart the pooled
		// connection was dead, and a new one will do.
		srv.dropIdle(err)
		err = srv.client.Set(&c.item)
	}
	c.item.Value = nil
	if err != nil {
		return c.upstreamError(id, srv, err)
	}
	if enveloped {
		c.countStored(vlen, len(value))
	}
	if tenant != nil {
		tenant.written.Add(uint64(len(value)))
	}
	st.record(id, outcomeStored)
	c.reply(replyStored)
	return nil
}

// tooLarge refuses a value over the size limits and consumes the n bytes
// of its data block still unread. k is the upstream key.
func (c *conn) tooLarge(id int, k string, n int) error {
	c.p.stats.record(id, outcomeClientError)
	c.reply(replyTooLarge)
	if id == cmdSet {
		// memcached drops the old value rather than keep serving it
		// after a set it could not store.
		c.up.servers[c.serverFor(k)].client.Delete(k)
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
	a.flags, okFlags = parseUint32(w[2])
	a.exptime, okExp = parseInt32(w[3])
	vlen, a.lenOK = parseInt32(w[4])
	a.lenOK = a.lenOK && vlen >= 0 && vlen <= math.MaxInt32-2
	a.vlen = int(vlen)
	okCas = true
	if withCAS {
		a.cas, okCas = parseUint64(w[5])
	}
	a.argsOK = okFlags && okExp && a.lenOK && okCas
	a.ok = a.argsOK && len(a.key) <= keyMaxLength && forwardable(a.key)
	return a
}
