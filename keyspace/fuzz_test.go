package keyspace

import (
	"bytes"
	"testing"
)

// FuzzRewrite checks the rewrite's promises on arbitrary keys: the upstream
// key is the client key when that can pass, and otherwise at most the limit,
// legal bytes only, starting with '~', the same on every call.
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
			k.Check(key)
			out, step, scheme := k.AppendRewrite(nil, key)
			checkUpstreamKey(t, k, key, out, step)
			again, step2, scheme2 := k.AppendRewrite(dst[:0], key)
			if !bytes.Equal(out, again) || step != step2 || scheme != scheme2 {
				t.Fatalf("%q: %q then %q", key, out, again)
			}
			checkTenant(t, k, key)
		}
	})
}

// FuzzUserScheme checks that no pattern a user can write breaks those
// promises.
func FuzzUserScheme(f *testing.F) {
	for _, d := range presetDefs {
		for _, p := range d.patterns {
			f.Add(p, []byte("P2:"+tenantID("a", 240)+":"+blockA+":x\x01"))
		}
	}
	f.Add("{}:{tenants}:{1}", []byte("a:b|c:d"))
	f.Add("{{{tenant}}}", []byte("{t}"))
	f.Fuzz(func(t *testing.T, pattern string, key []byte) {
		c := Config{MaxLength: 64, MaxClientLength: 4096, Presets: []string{"none"}, Schemes: []string{"f=" + pattern}}
		k, err := New(c)
		if err != nil || len(key) == 0 {
			return
		}
		k.SchemeOf(key)
		out, step, _ := k.AppendRewrite(nil, key)
		checkUpstreamKey(t, k, key, out, step)
		checkTenant(t, k, key)
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
