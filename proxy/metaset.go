package proxy

// The meta commands that write an item or delete it: ms and md.

import (
	"strconv"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// appendMetaStore appends the ms line that stores a value of size bytes
// under k with the item flags given and the client's TTL, CAS, mode and
// invalidation; withCAS asks for the new CAS value back.
func (c *conn) appendMetaStore(dst []byte, k string, m *metaReq, flags uint32, size int, withCAS bool) []byte {
	dst = append(dst, "ms "...)
	if m.WireBin {
		dst = wire.AppendBase64(dst, []byte(k))
	} else {
		dst = append(dst, k...)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if m.WireBin {
		dst = append(dst, " b"...)
	}
	dst = appendMetaFlag(dst, 'F', int64(flags))
	if m.HasTTL {
		dst = appendMetaFlag(dst, 'T', int64(m.TTL))
	}
	if m.HasCAS {
		dst = append(dst, " C"...)
		dst = strconv.AppendUint(dst, m.CAS, 10)
	}
	if m.Mode != 0 {
		dst = append(dst, ' ', 'M', m.Mode)
	}
	if m.Stale {
		dst = append(dst, " I"...)
	}
	if withCAS {
		dst = append(dst, " c"...)
	}
	return append(dst, wire.CRLF...)
}

// metaSetAnswer answers ms with code and the client's return flags in its
// order; cas is the c flag's value. quiet hides HD only.
func (c *conn) metaSetAnswer(m *metaReq, code, cas []byte) {
	oc := metaOutcome(code, stats.OutcomeStored)
	c.p.stats.Record(wire.CmdMetaSet, oc)
	if oc == stats.OutcomeStored && m.Quiet {
		return
	}
	if cas == nil {
		cas = metaZero
	}
	out := append(c.mst.out[:0], code...)
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			out = appendMetaKey(out, m.Key, m.Bin)
		case 'c':
			out = append(append(out, " c"...), cas...)
		}
	}
	c.mst.out = append(out, wire.CRLF...)
	c.wr.Write(c.mst.out)
}

// metaZero is the CAS value memcached returns when nothing was stored.
var metaZero = []byte("0")

// metaJoinOp is the read-modify-write of ms m in append or prepend mode,
// of data.
func (c *conn) metaJoinOp(m *metaReq, data []byte) rmw {
	return rmw{
		missing: func() bool {
			c.metaSetAnswer(m, metaCodeNotStore, nil)
			return false
		},
		change: func(old []byte, it *upstream.MetaItem) bool {
			if m.HasCAS && it.CAS != m.CAS {
				c.metaSetAnswer(m, metaCodeExists, nil)
				return false
			}
			c.join(m.Mode == 'A', old, data)
			return true
		},
		stored: func(notStored bool, cas uint64) bool {
			if notStored {
				c.metaSetAnswer(m, metaCodeNotStore, nil)
			} else {
				c.metaSetAnswer(m, metaCodeStored, strconv.AppendUint(c.scratch[:0], cas, 10))
			}
			return true
		},
	}
}
