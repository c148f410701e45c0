package proxy

import "mcsidecar/keyspace"

// numSteps is the number of keyspace.Step values, StepNone included: the
// stride of the rewrite counters, one row per scheme.
const numSteps = int(keyspace.StepWhole) + 1

// validKey reports whether a client key is accepted. Without key settings
// that is memcached's own 250-byte limit; with them, 1 to
// --key-max-client-length bytes. A refused key is counted by its reason.
func (c *conn) validKey(key []byte) bool {
	ks := c.p.keys
	if ks == nil {
		return len(key) <= keyMaxLength
	}
	ok, r := ks.Check(key)
	if !ok {
		c.p.stats.keyRejected[r&7].Add(1)
	}
	return ok
}

// tenantOf returns the per-tenant counters of a client key's tenant, or
// nil when the per-tenant view is off or the key names no tenant.
func (c *conn) tenantOf(key []byte) *tenantCounters {
	if c.p.tenants == nil {
		return nil
	}
	return c.p.tenants.counters(c.p.keys.Tenant(key))
}

// upstreamKey returns the key to send upstream for a client key validKey
// accepted: the key itself, or its rewrite in the connection's buffer
// (valid until the next call), and bound when it was rewritten, so that its
// values must be enveloped with the client key bound into them. ok is false
// for a key no server can hold, which happens only without key settings
// (gomemcache refuses control bytes and DEL).
func (c *conn) upstreamKey(key []byte) (up []byte, bound, ok bool) {
	ks := c.p.keys
	if ks == nil {
		return key, false, forwardable(key)
	}
	if !ks.NeedsRewrite(key) {
		return key, false, true
	}
	out, step, scheme := ks.AppendRewrite(c.upBuf[:0], key)
	c.upBuf = out
	c.p.stats.keyRewrites[c.p.schemeIndex[scheme]*numSteps+int(step)].Add(1)
	return out, true, true
}
