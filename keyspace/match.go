package keyspace

// Match is what one pass over the key schemes learned about a key: the
// first pattern it matches, if any, and where that pattern's segments lie
// in it. The proxy asks several things of every request key (its tenant,
// its scheme, whether its value never changes, its upstream key); a Match
// answers them all, each exactly as the Keyspace method of the same name
// would for the key, without matching the key again.
//
// A Match refers to its key and Keyspace and owns no memory: kept in a
// local variable it lives on the stack, and neither making one nor asking
// it anything allocates (but AppendRewrite into a dst without room).
type Match struct {
	k   *Keyspace
	key []byte
	p   *pattern // nil: no scheme matches the key
	seg match
}

// Match matches key against the key schemes once. key must have passed
// Check, and must not change while the Match is in use.
func (k *Keyspace) Match(key []byte) Match {
	var m Match
	k.MatchInto(&m, key)
	return m
}

// MatchInto is Match into m, which it overwrites: a caller that keeps one
// Match for every key it handles neither clears nor copies its segments
// each time.
func (k *Keyspace) MatchInto(m *Match, key []byte) {
	m.k, m.key = k, key
	m.seg.checked, m.seg.keepOK = 0, 0
	m.p = k.find(key, &m.seg)
}

// Forget lets go of the key, so that a Match kept for the next key does
// not hold the memory the last one was in.
func (m *Match) Forget() { m.k, m.key, m.p = nil, nil, nil }

// Scheme returns the scheme of the pattern the key matched, and false if
// it matched none: the answer of SchemeOf.
func (m *Match) Scheme() (Scheme, bool) {
	if m.p == nil {
		return Scheme{}, false
	}
	return *m.p.scheme, true
}

// Immutable reports whether the value stored under the key never changes:
// the answer of Immutable.
func (m *Match) Immutable() bool { return m.p != nil && m.p.immutable }

// Tenant returns the key's tenant segment, a sub-slice of the key, or
// nil: the answer of Tenant.
func (m *Match) Tenant() []byte { return m.p.tenant(m.key, &m.seg) }

// AppendRewrite appends the upstream key for the key to dst: the answer
// of the Keyspace's AppendRewrite, found from this match.
func (m *Match) AppendRewrite(dst []byte) (out []byte, step Step, scheme string) {
	if !m.k.NeedsRewrite(m.key) {
		return append(dst, m.key...), StepNone, ""
	}
	return m.Rewrite(dst)
}

// Rewrite is AppendRewrite for a key that NeedsRewrite (or Inspect) found
// needs a rewrite: it appends the rewrite without reading the key again
// to find out.
func (m *Match) Rewrite(dst []byte) (out []byte, step Step, scheme string) {
	return m.k.rewrite(dst, m.key, m.p, &m.seg)
}
