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
	c.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	key := w[1]
	flags, okFlags := parseUint32(w[2])
	exptime, okExp := parseInt32(w[3])
	vlen, okLen := parseInt32(w[4])
	okLen = okLen && vlen >= 0 && vlen <= math.MaxInt32-2
	okCas := true
	var casID uint64
	if id == cmdCas {
		casID, okCas = parseUint64(w[5])
	}
	if len(key) > keyMaxLength || !okFlags || !okExp || !okLen || !okCas || !forwardable(key) {
		st.record(id, outcomeClientError)
		c.reply(replyBadFormat)
		if okLen {
			return c.rd.discard(int(vlen) + 2)
		}
		return nil
	}
	if int(vlen) > int(c.p.cfg.MaxItemSize) {
		st.record(id, outcomeClientError)
		c.reply(replyTooLarge)
		if id == cmdSet {
			// memcached drops the old value rather than keep serving it
			// after a set it could not store.
			k := string(key)
			c.p.servers[c.serverFor(k)].client.Delete(k)
		}
		return c.rd.discard(int(vlen) + 2)
	}
	k := string(key) // key points into the read buffer, which data may move
	data, err := c.rd.data(int(vlen) + 2)
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
	c.item.Flags = flags
	c.item.Expiration = exptime
	c.item.CasID = casID
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
	c.item.Value = nil
	if err != nil {
		reply, oc := upstreamReply(err)
		if oc == outcomeUpstreamError {
			c.p.upstreamFailed(err)
		}
		st.record(id, oc)
		c.reply(reply)
		return nil
	}
	st.record(id, outcomeStored)
	c.reply(replyStored)
	return nil
}

var noreplyWord = []byte("noreply")
