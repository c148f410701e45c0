package keyspace

import (
	"bytes"
	"testing"
)

// FuzzRewrite checks the rewrite's promises on arbitrary keys: the upstream
// key is the client key when that can pass, and otherwise at most the limit,
// legal bytes only, starting with '~', the same on every call; and one
// Match of the key answers as the separate calls do.
func FuzzRewrite(f *testing.F) {
	for _, in := range goldenInputs() {
		f.Add([]byte(in.key))
	}
	f.Add([]byte("~"))
	f.Add([]byte("a b"))
	ks := []*Keyspace{
		newKeyspace(f, nil),
		newKeyspace(f, func(c *Config) {
			c.MaxLength = 64
			c.Schemes = []string{"u=P2:{tenant}:{ulid}:{2}:{1}", "v={}|{tenants}/{3}:{2}:{1}"}
		}),
	}
	dst := make([]byte, 0, 512)
	f.Fuzz(func(t *testing.T, key []byte) {
		if len(key) == 0 {
			return
		}
		for _, k := range ks {
			checkInspect(t, k, key)
			out, step, scheme := k.AppendRewrite(nil, key)
			checkUpstreamKey(t, k, key, out, step)
			again, step2, scheme2 := k.AppendRewrite(dst[:0], key)
			if !bytes.Equal(out, again) || step != step2 || scheme != scheme2 {
				t.Fatalf("%q: %q then %q", key, out, again)
			}
			checkTenant(t, k, key)
			checkMatch(t, k, key)
		}
	})
}

// FuzzUserScheme checks that no pattern a user can write breaks those
// promises, nor the package's promise that two accepted keys share an
// upstream key only by a hash collision: kept segments hold no '~' and
// tokens have a fixed length, so two distinct keys that are both rewritten
// must come out distinct (a 96-bit collision is beyond a fuzz run's reach).
func FuzzUserScheme(f *testing.F) {
	for _, d := range presetDefs {
		for _, p := range d.patterns {
			f.Add(p, []byte("P2:"+tenantID("a", 240)+":"+blockA+":x\x01"), []byte("P2:"+tenantID("b", 240)+":"+blockA+":x\x01"))
		}
	}
	f.Add("{}:{tenants}:{1}", []byte("a:b|c:d"), []byte("a:b|c:d\x01"))
	f.Add("{{{tenant}}}", []byte("{t}"), []byte("{t\x01}"))
	f.Add("a{1}-{2}", []byte("a\x01-b"), []byte("a\x01-b-c"))
	f.Fuzz(func(t *testing.T, pattern string, key, key2 []byte) {
		c := Config{MaxLength: 64, MaxClientLength: 4096, Presets: []string{"none"}, Schemes: []string{"f=" + pattern}}
		k, err := New(c)
		if err != nil || len(key) == 0 {
			return
		}
		k.SchemeOf(key)
		out, step, _ := k.AppendRewrite(nil, key)
		checkUpstreamKey(t, k, key, out, step)
		checkTenant(t, k, key)
		checkMatch(t, k, key)
		ok, _ := k.Check(key)
		ok2, _ := k.Check(key2)
		if !ok || !ok2 || bytes.Equal(key, key2) || step == StepNone {
			return
		}
		if out2, step2, _ := k.AppendRewrite(nil, key2); step2 != StepNone && bytes.Equal(out, out2) {
			t.Fatalf("%q (step %v) and %q (step %v) share upstream key %q", key, step, key2, step2, out)
		}
	})
}

// checkTenant fails t unless Tenant returns nil or a non-empty part of
// key with no room to write past it, and a tenant only for a key some
// scheme matches.
func checkTenant(t *testing.T, k *Keyspace, key []byte) {
	t.Helper()
	tenant := k.Tenant(key)
	if tenant == nil {
		return
	}
	if len(tenant) == 0 || cap(tenant) != len(tenant) || !bytes.Contains(key, tenant) {
		t.Fatalf("%q: tenant %q (cap %d) is not a non-empty part of the key", key, tenant, cap(tenant))
	}
	if _, ok := k.SchemeOf(key); !ok {
		t.Fatalf("%q: tenant %q for a key no scheme matches", key, tenant)
	}
}

// checkInspect fails t unless Inspect answers as a byte-by-byte reading of
// the rules does, and as Check and NeedsRewrite do.
func checkInspect(t *testing.T, k *Keyspace, key []byte) {
	t.Helper()
	want, rewrite := ReasonOK, len(key) > k.maxLen
	switch {
	case len(key) == 0:
		want = ReasonEmpty
	case len(key) > k.maxClientLen:
		want = ReasonTooLong
	default:
		for _, c := range key {
			switch {
			case c == ' ' || c == '\r' || c == '\n' || c == 0:
				want = ReasonBadByte
			case c < ' ' || c == 0x7f:
				rewrite = true
			}
		}
	}
	if want != ReasonOK {
		rewrite = false
	}
	r, rw := k.Inspect(key)
	if r != want || rw != rewrite {
		t.Fatalf("%q: Inspect says %v, rewrite %v; want %v, %v", key, r, rw, want, rewrite)
	}
	if ok, cr := k.Check(key); ok != (r == ReasonOK) || cr != r {
		t.Fatalf("%q: Check says %v, %v; Inspect %v", key, ok, cr, r)
	}
	if r == ReasonOK && k.NeedsRewrite(key) != rw {
		t.Fatalf("%q: NeedsRewrite says %v; Inspect %v", key, !rw, rw)
	}
}
