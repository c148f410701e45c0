package proxy

// The meta commands that read: mg, and me, which describes an item.

import (
	"bytes"
	"fmt"
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// metaMiss answers a meta get that found nothing: EN, unless quiet.
func (c *conn) metaMiss(m *metaReq) {
	c.p.stats.Record(wire.CmdMetaGet, stats.OutcomeMiss)
	c.writeMetaMiss(m)
}

// writeMetaMiss writes EN, unless quiet.
func (c *conn) writeMetaMiss(m *metaReq) {
	if m.Quiet {
		return
	}
	c.mst.out = appendMetaNoItem(append(c.mst.out[:0], metaCodeMiss...), m)
	c.wr.Write(c.mst.out)
}

// metaFillExptime is the exptime a fill of mg m's hit r stores with: the
// touch's new one, or the item's remaining time to live. ok is false for
// an item gone in under a second, which is not worth it.
func metaFillExptime(m *metaReq, r *metaReply) (exptime int64, ok bool) {
	switch tok, _ := r.flag('t'); {
	case m.HasTTL:
		return int64(m.TTL), true
	case string(tok) == "-1":
		return 0, true
	default:
		ttl, ok := wire.ParseDecimal(tok, 1<<31-1)
		if !ok || ttl == 0 {
			return 0, false
		}
		return wire.ExptimeOf(int32(ttl)), true
	}
}

// appendMetaFill appends the ms line of a fill: k, in base64 when bin,
// with size bytes of the item's flags and exptime, stored only where the
// local zone has no item (mode E).
func appendMetaFill(dst []byte, k string, bin bool, size int, flags uint32, exptime int64) []byte {
	dst = append(dst, "ms "...)
	if bin {
		dst = wire.AppendBase64(dst, []byte(k))
	} else {
		dst = append(dst, k...)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if bin {
		dst = append(dst, " b"...)
	}
	dst = appendMetaFlag(dst, 'F', int64(flags))
	dst = appendMetaFlag(dst, 'T', exptime)
	return append(dst, " ME\r\n"...)
}

// metaGetAnswer answers mg m, whose key's value is bound to it when
// bound, from memcached's reply line and the value of a hit (or err, from
// srv), as both paths answer it. For a hit it returns the reply, parsed,
// and the item's flags as memcached holds them, for a fill; damaged
// reports an envelope that is to be deleted.
func (c *conn) metaGetAnswer(m *metaReq, bound bool, line, value []byte, srv *upstream.Server, err error) (hit *metaReply, storedFlags uint32, damaged bool) {
	if err != nil {
		if c.p.cfg.RetrievalFailure == failureError {
			c.upstreamError(wire.CmdMetaGet, srv, err)
			return nil, 0, false
		}
		// A miss for the client, an upstream error in the counters.
		srv.DropIdle(err)
		c.metaCountKey(m, false)
		c.p.stats.Record(wire.CmdMetaGet, stats.OutcomeUpstreamError)
		c.writeMetaMiss(m)
		return nil, 0, false
	}
	r, ok := c.metaParse(line)
	if _, hasFlags := r.flag('f'); ok && c.p.codec != nil && r.code == [2]byte{'V', 'A'} && !hasFlags {
		// Asked for (see appendMetaGet), and always returned by
		// memcached: without them an envelope would look like a plain
		// value. The reply was damaged on the way.
		return c.metaGetAnswer(m, bound, nil, nil, srv, fmt.Errorf("mg: memcached replied without the item's flags: %q", line))
	}
	if !ok || r.code != [2]byte{'V', 'A'} && r.code != [2]byte{'H', 'D'} {
		if bytes.HasPrefix(line, metaCodeMiss) {
			c.metaCountKey(m, false)
			c.metaMiss(m)
			return nil, 0, false
		}
		// memcached's own error (refcount overflow, out of memory).
		c.answer(wire.CmdMetaGet, line)
		return nil, 0, false
	}
	var flags uint32
	if tok, ok := r.flag('f'); ok {
		flags, _ = wire.ParseUint32(tok)
	}
	storedFlags = flags
	if c.p.codec != nil {
		enveloped := c.p.codec.IsEnveloped(flags)
		switch {
		case enveloped:
			c.keyBuf = append(c.keyBuf[:0], m.Key...)
			value, flags, ok, damaged = c.openValue(c.keyBuf, bound, flags, value)
			if !ok {
				c.metaCountKey(m, false)
				c.metaMiss(m)
				return nil, 0, damaged
			}
		case bound && (len(value) > 0 || flags != 0):
			// Under a rewritten key, a plain item is some client's own
			// value at an equal key: a miss. An empty one with no flags
			// is the stub N created, and holds nothing of anyone's.
			c.p.stats.KeyUnbound.Add(1)
			c.metaCountKey(m, false)
			c.metaMiss(m)
			return nil, 0, false
		}
	}
	codec := c.p.codec != nil
	c.metaCountKey(m, true)
	c.p.stats.Record(wire.CmdMetaGet, stats.OutcomeHit)
	out := c.mst.out[:0]
	if m.Value {
		out = append(out, wire.LineMetaValue...)
		out = strconv.AppendInt(out, int64(len(value)), 10)
	} else {
		out = append(out, metaCodeStored...)
	}
	for _, f := range m.Flags[:m.NFlags] {
		switch l := f[0]; l {
		case 's':
			if codec {
				out = appendMetaFlag(out, 's', int64(len(value)))
			} else if tok, ok := r.flag('s'); ok {
				out = append(append(out, ' ', 's'), tok...)
			}
		case 'f':
			out = appendMetaFlag(out, 'f', int64(flags))
		case 't', 'c', 'l', 'h':
			if tok, ok := r.flag(l); ok {
				out = append(append(out, ' ', l), tok...)
			}
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			_, bin := r.flag('b')
			out = appendMetaKey(out, m.Key, bin || m.Bin && !m.WireBin)
		}
	}
	// memcached ends with Z (a win was sent), X (stale), W (won).
	for i := range len(metaEndFlags) {
		if _, ok := r.flag(metaEndFlags[i]); ok {
			out = append(out, ' ', metaEndFlags[i])
		}
	}
	out = append(out, wire.CRLF...)
	c.mst.out = out
	c.wr.Write(out)
	if m.Value {
		c.wr.Write(value)
		c.wr.Write(wire.CRLF)
	}
	return r, storedFlags, false
}

// appendMetaGet appends the mg that asks upstream for what the client's
// mg needs: its flags but b, O, q, k (and N unless vivify), in its order,
// the value and flags when an envelope may have to be opened (codec) or
// the hit filled into the local zone, and the TTL for that fill.
func (c *conn) appendMetaGet(dst []byte, k string, m *metaReq, codec, filling, vivify bool) []byte {
	dst = appendMetaHead(dst, "mg ", k, m.WireBin)
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 's', 't', 'c', 'f', 'l', 'h', 'v', 'u', 'k':
			dst = append(dst, ' ', f[0])
		case 'T':
			dst = appendMetaFlag(dst, 'T', int64(m.TTL))
		case 'N':
			if vivify {
				dst = appendMetaFlag(dst, 'N', int64(m.Vivify))
			}
		case 'R':
			dst = appendMetaFlag(dst, 'R', int64(m.Recache))
		}
	}
	if (codec || filling) && !m.Has('v') {
		dst = append(dst, " v"...)
	}
	if (codec || filling) && !m.Has('f') {
		dst = append(dst, " f"...)
	}
	if filling && !m.Has('t') {
		dst = append(dst, " t"...)
	}
	return append(dst, wire.CRLF...)
}

// metaEndFlags are the flags memcached appends to an mg hit, in its order.
const metaEndFlags = "ZXW"

// metaCountKey counts an mg's key as a retrieval's, hit or miss, for
// the proxy and for the key's tenant.
func (c *conn) metaCountKey(m *metaReq, hit bool) {
	tally := stats.Tally{Touch: m.HasTTL}
	tally.Add(c.p.tenants.Counters(m.rk.tenant), hit)
	tally.Flush(c.p.stats)
}

// metaDebugAnswer answers me m of upstream key k from memcached's reply
// line, or err, from srv, as both paths answer it.
func (c *conn) metaDebugAnswer(m *metaReq, k string, line []byte, srv *upstream.Server, err error) {
	if err != nil {
		c.upstreamError(wire.CmdMetaDebug, srv, err)
		return
	}
	rest, ok := bytes.CutPrefix(line, []byte("ME "))
	if !ok {
		oc := stats.OutcomeMiss
		if !bytes.Equal(line, wire.LineMetaMiss) {
			oc = stats.ReplyOutcome(line)
		}
		c.p.stats.Record(wire.CmdMetaDebug, oc)
		c.wr.Write(line)
		return
	}
	c.p.stats.Record(wire.CmdMetaDebug, stats.OutcomeHit)
	sent, info, _ := bytes.Cut(rest, []byte{' '})
	out := append(c.mst.out[:0], "ME "...)
	if string(sent) != k {
		out = wire.AppendBase64(out, m.Key) // memcached holds the key as binary
	} else {
		out = append(out, m.Key...)
	}
	out = append(append(out, ' '), info...)
	c.mst.out = out
	c.wr.Write(out)
}
