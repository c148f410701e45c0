package proxy

import (
	"bytes"
	"testing"

	"mcsidecar/keyspace"
)

// TestOneResolveAnswersAsTheSeparateQuestions holds resolve to what the
// proxy asked of a key one question at a time before it matched the key
// once: upstream key, tenant, postings and immutability, with every
// feature that reads them on. Asked for nothing, it leaves them zero.
func TestOneResolveAnswersAsTheSeparateQuestions(t *testing.T) {
	cfg := keyspaceConfig("127.0.0.1:1")
	cfg.LocalCacheSize = 1 << 20
	cfg.MetricsTenants = 10
	p, err := New(cfg, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.closeServers()
	c := &conn{p: p}
	// postingsKey is the question on its own: values under the key may
	// be raw postings lists when it starts with one of --codec-prefixes or
	// matches a scheme marked +postings.
	postingsKey := func(key []byte) bool {
		if p.codec.PostingsKey(key) {
			return true
		}
		s, ok := p.keys.SchemeOf(key)
		return ok && s.Postings
	}
	for _, key := range []string{
		"P2:tenant:" + testBlock + ":am9iOmFwaQ",
		"S:tenant:" + testBlock + ":12345",
		"P2:tenant\x01:" + testBlock + ":am9iOmFwaQ",
		mimirLV2Key(),
		crossTenant(1000),
		"subrange:tenant/" + testBlock + "/index:0:100",
		"subrange:tenant/bucket-index.json.gz:0:10",
		"P:" + testBlock + ":" + testHash43 + ":dss",
		"no scheme reads this key",
		"no\x7fscheme",
	} {
		k := []byte(key)
		rk := c.resolve(k, needTenant|needPostings|needImmutable)
		up, step, _ := p.keys.AppendRewrite(nil, k)
		if !bytes.Equal(rk.up, up) || rk.bound != (step != keyspace.StepNone) || !rk.ok {
			t.Errorf("%q: upstream key %q (bound %v, ok %v), want %q (step %v)", key, rk.up, rk.bound, rk.ok, up, step)
		}
		if want := p.keys.Tenant(k); !bytes.Equal(rk.tenant, want) {
			t.Errorf("%q: tenant %q, want %q", key, rk.tenant, want)
		}
		if want := postingsKey(k); rk.postings != want {
			t.Errorf("%q: postings %v, want %v", key, rk.postings, want)
		}
		if want := p.keys.Immutable(k); rk.immutable != want {
			t.Errorf("%q: immutable %v, want %v", key, rk.immutable, want)
		}
		if rk := c.resolve(k, 0); rk.tenant != nil || rk.immutable || !bytes.Equal(rk.up, up) {
			t.Errorf("%q asked for nothing: tenant %q, immutable %v, upstream key %q", key, rk.tenant, rk.immutable, rk.up)
		}
	}
	lv2 := []byte(mimirLV2Key())
	if n := testing.AllocsPerRun(100, func() { c.resolve(lv2, needTenant|needPostings|needImmutable) }); n != 0 {
		t.Errorf("resolving a rewritten key: %v allocations", n)
	}
}
