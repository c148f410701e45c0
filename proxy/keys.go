package proxy

import (
	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
)

// numSteps is the number of keyspace.Step values, StepNone included: the
// stride of the rewrite counters, one row per scheme.
const numSteps = int(keyspace.StepWhole) + 1

// validKey reports whether a client key is accepted. Without key settings
// that is memcached's own 250-byte limit; with them, 1 to
// --key-max-client-length bytes. A refused key is counted by its reason.
func (c *conn) validKey(key []byte) bool {
	ok, r := c.checkKey(key)
	if !ok {
		c.countRefused(r)
	}
	return ok
}

// validMetaKey is validKey for a meta command's key, which in base64
// (flag b) may hold any bytes once decoded.
func (c *conn) validMetaKey(m *metaReq) bool {
	ok, r := c.checkMetaKey(m)
	if !ok {
		c.countRefused(r)
	}
	return ok
}

// countRefused counts a key refused for reason r, as inspect or
// checkMetaKey gave it. Without key settings nothing is counted.
func (c *conn) countRefused(r keyspace.Reason) {
	if c.p.keys != nil {
		c.p.stats.KeyRejected[r&7].Add(1)
	}
}

// checkMetaKey is validMetaKey without counting a refusal.
func (c *conn) checkMetaKey(m *metaReq) (bool, keyspace.Reason) {
	if m.Bin && c.p.keys != nil {
		return c.p.keys.CheckBinary(m.Key)
	}
	return c.checkKey(m.Key)
}

// checkKey is validKey without counting a refusal: whether the proxy takes
// key, and with key settings why not.
func (c *conn) checkKey(key []byte) (bool, keyspace.Reason) {
	k := c.inspect(key)
	return k.ok, k.reason
}

// keyCheck is what one scan of a client key finds: whether the proxy takes
// it, with key settings why not, and whether it goes upstream rewritten.
type keyCheck struct {
	ok      bool
	reason  keyspace.Reason
	rewrite bool
}

// inspect scans key once for checkKey and for the rewrite that lookup
// would otherwise look for again (see resolveChecked).
func (c *conn) inspect(key []byte) keyCheck {
	if c.p.keys == nil {
		return keyCheck{ok: len(key) <= wire.KeyMaxLength}
	}
	r, rewrite := c.p.keys.Inspect(key)
	return keyCheck{ok: r == keyspace.ReasonOK, reason: r, rewrite: rewrite}
}

// What a command asks resolve about a key besides its upstream key. A key
// is matched against the key schemes at most once, and only when the
// match is read: the key is rewritten, or the command asks for something
// that a feature that is on needs (per-tenant counters, the codec, the
// local tier).
const (
	needTenant    uint8 = 1 << iota // the key is counted per tenant
	needPostings                    // its value is enveloped (see postingsKey)
	needImmutable                   // the local tier may keep its value
)

// postingsIf returns needPostings for a value that is enveloped, whose
// envelope depends on whether it may be a postings list.
func postingsIf(enveloped bool) uint8 {
	if enveloped {
		return needPostings
	}
	return 0
}

// resolvedKey is what the proxy knows of a client key validKey accepted.
// A field that was not asked for (or whose feature is off) is zero.
type resolvedKey struct {
	// up is the key to send upstream: the client key, or its rewrite in
	// the connection's buffer (valid until the next resolve).
	up []byte
	// bound is true when up is a rewrite, so that its values must be
	// enveloped with the client key bound into them.
	bound bool
	// ok is false for a key no server can hold, which happens only
	// without key settings (gomemcache refuses control bytes and DEL).
	ok bool
	// tenant is the key's tenant segment, a sub-slice of it; nil: none.
	tenant []byte
	// postings says the key's enveloped values may be raw postings lists,
	// as postingsKey decides. It is decided when asked for, and for every
	// rewritten key, whose values are always enveloped.
	postings bool
	// immutable says the key's value never changes.
	immutable bool
	// rewrite is the counter of a rewrite (bound): its scheme and step.
	rewrite int
}

// resolve finds what need asks of key, and its upstream key, from one
// match against the key schemes at most. A rewrite is counted.
func (c *conn) resolve(key []byte, need uint8) resolvedKey {
	return c.resolveChecked(key, need, c.needsRewrite(key))
}

// resolveChecked is resolve for a key inspect scanned already, which found
// whether it is rewritten.
func (c *conn) resolveChecked(key []byte, need uint8, rewrite bool) resolvedKey {
	r := c.lookupChecked(key, need, rewrite)
	c.countRewrite(r)
	return r
}

// needsRewrite reports whether a key the proxy takes is sent upstream
// rewritten.
func (c *conn) needsRewrite(key []byte) bool {
	return c.p.keys != nil && c.p.keys.NeedsRewrite(key)
}

// countRewrite counts the rewrite of a key lookup resolved.
func (c *conn) countRewrite(r resolvedKey) {
	if r.bound {
		c.p.stats.KeyRewrites[r.rewrite].Add(1)
	}
}

// lookup is resolve without counting the rewrite, for a caller that may
// still hand the request on to be resolved again.
func (c *conn) lookup(key []byte, need uint8) resolvedKey {
	return c.lookupChecked(key, need, c.needsRewrite(key))
}

// lookupChecked is lookup for a key inspect scanned already.
func (c *conn) lookupChecked(key []byte, need uint8, rewrite bool) resolvedKey {
	r := resolvedKey{up: key, ok: true}
	ks := c.p.keys
	postings := need&needPostings != 0 || rewrite
	if postings && c.p.codec != nil && c.p.codec.PostingsKey(key) {
		// A --codec-prefixes key is postings-bearing whatever its scheme.
		r.postings, postings = true, false
	}
	if ks == nil {
		r.ok = wire.Forwardable(key)
		return r
	}
	tenant := need&needTenant != 0 && c.p.tenants != nil
	if !rewrite && !postings && !tenant && need&needImmutable == 0 {
		return r
	}
	m := &c.match
	ks.MatchInto(m, key)
	if tenant {
		r.tenant = m.Tenant()
	}
	if need&needImmutable != 0 {
		r.immutable = m.Immutable()
	}
	if postings {
		s, _ := m.Scheme()
		r.postings = s.Postings
	}
	if rewrite {
		out, step, scheme := m.Rewrite(c.upBuf[:0])
		c.upBuf = out
		r.up, r.bound, r.rewrite = out, true, c.p.schemeIndex[scheme]*numSteps+int(step)
	}
	m.Forget()
	return r
}
