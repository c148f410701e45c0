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
	st.cmdSet.Add(1)
	a := parseStoreArgs(w, id == cmdCas)
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
	if vlen > int(c.p.cfg.MaxItemSize) {
		st.record(id, outcomeClientError)
		c.reply(replyTooLarge)
		if id == cmdSet {
			// memcached drops the old value rather than keep serving it
			// after a set it could not store.
			k := string(key)
			c.p.servers[c.serverFor(k)].client.Delete(k)
		}
		return c.rd.discard(vlen + 2)
	}
	k := string(key) // key points into the read buffer, which data may move
	data, err := c.rd.data(vlen + 2)
	if err != nil {
		return err
	}
	if !bytes.HasSuffix(data, crlf) {
		st.record(id, outcomeClientError)
		c.reply(replyBadChunk)
		return nil
	}
	c.item.Key = k
	c.item.Value = data[:vlen]
	c.item.Flags = a.flags
	c.item.Expiration = a.exptime
	c.item.CasID = a.cas
	srv := c.p.servers[c.serverFor(k)]
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
	st.record(id, outcomeStored)
	c.reply(replyStored)
	return nil
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
	ok      bool // every argument is valid
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
	a.ok = okFlags && okExp && a.lenOK && okCas && len(a.key) <= keyMaxLength && forwardable(a.key)
	return a
}
