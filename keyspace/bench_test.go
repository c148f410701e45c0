package keyspace

import "testing"

// BenchmarkCheckLegalKey measures what every key of every request pays:
// Check and NeedsRewrite on a legal key that passes unchanged. It must not
// allocate.
func BenchmarkCheckLegalKey(b *testing.B) {
	k := newKeyspace(b, nil)
	for _, bc := range []struct {
		name string
		key  []byte
	}{
		{"mimir-p2-100B", []byte("P2:tenant-1:" + blockA + ":" + hash43 + ":abcdefghijklmnop")},
		{"250B", []byte(tenantID("acme", 250))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.key)))
			for b.Loop() {
				if ok, _ := k.Check(bc.key); !ok || k.NeedsRewrite(bc.key) {
					b.Fatal("legal key refused")
				}
			}
		})
	}
}

// BenchmarkRewrite measures the keys that must be rewritten: the 282-byte
// Mimir LV2 key of a 150-byte tenant and a 4 KiB cross-tenant results key.
// With room in dst a rewrite must not allocate; without, once, for its
// output.
func BenchmarkRewrite(b *testing.B) {
	k := newKeyspace(b, func(c *Config) { c.MaxClientLength = 8192 })
	for _, bc := range []struct {
		name string
		key  []byte
	}{
		{"mimir-lv2-282B", []byte(lv2Key(tenantID("acme", 150), blockA, lv2Label282))},
		{"cross-tenant-4KiB", []byte(crossTenantKey(4096))},
		{"no-scheme-control-byte", []byte("memcaslap\x01key-0123456789")},
	} {
		b.Run(bc.name+"/dst-with-room", func(b *testing.B) {
			dst := make([]byte, 0, 256)
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.key)))
			for b.Loop() {
				dst, _, _ = k.AppendRewrite(dst[:0], bc.key)
			}
		})
		b.Run(bc.name+"/nil-dst", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.key)))
			for b.Loop() {
				k.AppendRewrite(nil, bc.key)
			}
		})
	}
}

// BenchmarkSchemeOf measures the postings lookup the value codec makes for
// keys that pass unchanged.
func BenchmarkSchemeOf(b *testing.B) {
	k := newKeyspace(b, nil)
	key := []byte("P2:tenant-1:" + blockA + ":am9iOmFwaQ")
	b.ReportAllocs()
	for b.Loop() {
		if s, _ := k.SchemeOf(key); !s.Postings {
			b.Fatal("not postings")
		}
	}
}

// TestValidationAndRewriteDoNotAllocate holds the benchmarks' allocation
// promises in the ordinary test run.
func TestValidationAndRewriteDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	k := newKeyspace(t, func(c *Config) { c.MaxClientLength = 8192 })
	legal := []byte(tenantID("acme", 250))
	long := []byte(lv2Key(tenantID("acme", 150), blockA, lv2Label282))
	cross := []byte(crossTenantKey(4096))
	dst := make([]byte, 0, 256)
	cases := map[string]func(){
		"check legal key":         func() { k.Check(legal); k.NeedsRewrite(legal) },
		"scheme lookup":           func() { k.SchemeOf(long) },
		"rewrite LV2 into room":   func() { dst, _, _ = k.AppendRewrite(dst[:0], long) },
		"rewrite 4 KiB into room": func() { dst, _, _ = k.AppendRewrite(dst[:0], cross) },
		"one match, every answer": func() {
			m := k.Match(long)
			m.Tenant()
			m.Scheme()
			m.Immutable()
			dst, _, _ = m.AppendRewrite(dst[:0])
		},
	}
	for name, fn := range cases {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { k.AppendRewrite(nil, long) }); n != 1 {
		t.Errorf("rewrite into nil: %v allocations, want 1", n)
	}
}
