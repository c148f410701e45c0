package proxy

// The meta arithmetic command, ma, on plain and enveloped counters.

import (
	"strconv"
	"time"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// metaArithmeticReq makes, in c.req, the ma request that goes upstream for
// m: the client's flags but q, which would leave a shared connection short
// of a reply, and N only when vivify is set.
func (c *conn) metaArithmeticReq(m *metaReq, k string, vivify bool) []byte {
	dst := appendMetaHead(c.req[:0], "ma ", k, m.WireBin)
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 't', 'c', 'v':
			dst = append(dst, ' ', f[0])
		case 'T':
			dst = appendMetaFlag(dst, 'T', int64(m.TTL))
		case 'N':
			if vivify {
				dst = appendMetaFlag(dst, 'N', int64(m.Vivify))
			}
		case 'J':
			dst = append(dst, " J"...)
			dst = strconv.AppendUint(dst, m.Initial, 10)
		case 'D':
			dst = append(dst, " D"...)
			dst = strconv.AppendUint(dst, m.Delta, 10)
		case 'C':
			dst = append(dst, " C"...)
			dst = strconv.AppendUint(dst, m.CAS, 10)
		case 'M':
			dst = append(dst, ' ', 'M', m.Mode)
		}
	}
	c.req = append(dst, wire.CRLF...)
	return c.req
}

// metaArithOp is the read-modify-write of ma m. A missing item is NF, or
// with N created from J (default 0), with N's time to live, by an add.
func (c *conn) metaArithOp(m *metaReq) rmw {
	id := wire.CmdMetaArithmetic
	var n uint64
	var oldTTL int32
	return rmw{
		missing: func() bool {
			c.metaAnswer(id, m, metaCodeNotFound, nil, nil)
			return false
		},
		create: func() ([]byte, int64, bool) {
			if !m.HasVivify {
				return nil, 0, false
			}
			c.tmp = strconv.AppendUint(c.tmp[:0], m.Initial, 10)
			return c.tmp, wire.ExptimeOf(metaTTL(m, -1, true)), true
		},
		created: func(cas uint64) {
			m.Quiet = false // memcached answers a creation even when asked quietly
			c.metaArithmeticAnswer(m, m.Initial, cas, -1, true)
		},
		change: func(old []byte, it *upstream.MetaItem) bool {
			if m.HasCAS && m.CAS != 0 && it.CAS != m.CAS { // ma reads C0 as no CAS
				c.metaAnswer(id, m, metaCodeExists, nil, nil)
				return false
			}
			var ok bool
			if n, ok = c.count(old, m.Mode != 'D' && m.Mode != '-', m.Delta); !ok {
				c.clientError(id, wire.LineNonNumeric)
				return false
			}
			oldTTL = it.TTL
			it.TTL = metaTTL(m, oldTTL, false)
			return true
		},
		stored: func(notStored bool, cas uint64) bool {
			if notStored {
				return false // a number always fits: try again
			}
			c.metaArithmeticAnswer(m, n, cas, oldTTL, false)
			return true
		},
	}
}

// metaTTL walks ma's flags in order as memcached does: T sets the item's
// time to live, and N does when the item was just created. It returns the
// time to live the item ends with (seconds, -1: never).
func metaTTL(m *metaReq, ttl int32, created bool) int32 {
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 'T':
			ttl = ttlOf(m.TTL)
		case 'N':
			if created {
				ttl = ttlOf(m.Vivify)
			}
		}
	}
	return ttl
}

// ttlOf is the time to live an exptime gives, in seconds (-1: never; 0:
// already expired), as memcached reads exptimes.
func ttlOf(exptime int32) int32 {
	switch {
	case exptime == 0:
		return -1
	case exptime < 0:
		return 0
	case exptime > wire.MaxRelativeTTL:
		return max(0, exptime-int32(time.Now().Unix()))
	}
	return exptime
}

// metaArithmeticAnswer answers an enveloped ma that took: HD or VA with the
// number, c the new CAS value, t the time to live as it stood where the
// client put t.
func (c *conn) metaArithmeticAnswer(m *metaReq, n, cas uint64, ttl int32, created bool) {
	c.p.stats.Record(wire.CmdMetaArithmetic, stats.OutcomeOK)
	if m.Quiet {
		return
	}
	out := c.mst.out[:0]
	c.scratch = strconv.AppendUint(c.scratch[:0], n, 10)
	if m.Value {
		out = append(out, wire.LineMetaValue...)
		out = strconv.AppendInt(out, int64(len(c.scratch)), 10)
	} else {
		out = append(out, metaCodeStored...)
	}
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 'T':
			ttl = ttlOf(m.TTL)
		case 'N':
			if created {
				ttl = ttlOf(m.Vivify)
			}
		case 'c':
			out = append(out, " c"...)
			out = strconv.AppendUint(out, cas, 10)
		case 't':
			out = appendMetaFlag(out, 't', int64(ttl))
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			out = appendMetaKey(out, m.Key, m.Bin)
		}
	}
	out = append(out, wire.CRLF...)
	if m.Value {
		out = append(append(out, c.scratch...), wire.CRLF...)
	}
	c.mst.out = out
	c.wr.Write(out)
}
