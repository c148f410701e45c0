package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"
)

// hashedLabel is the documented label of a tenant ID that cannot be its
// own: the first bytes that fit, '~', and 12 hex digits of its SHA-256.
func hashedLabel(readable, tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return readable + "~" + hex.EncodeToString(sum[:])[:12]
}

func TestTenantLabelRules(t *testing.T) {
	at150 := testTenant("a", 150)
	over := at150 + "-one"
	accents := strings.Repeat("é", 100) // 200 bytes, two a rune
	free := func(string) bool { return false }
	for _, c := range []struct{ name, tenant, want string }{
		{"an ID that fits is its own label", "team-a", "team-a"},
		{"an ID of 150 bytes is its own label", at150, at150},
		{"an ID over 150 bytes keeps 137 bytes and a hash of the whole", over, hashedLabel(over[:137], over)},
		{"a cut never splits a character", accents, hashedLabel(accents[:136], accents)},
		{"an ID that is not UTF-8 reads with a replacement character", "bad\xffid", hashedLabel("bad\uFFFDid", "bad\xffid")},
		{"an ID named other is not other", "other", hashedLabel("other", "other")},
		{"an ID holding ~ is hashed, so it never equals a hashed label", "a~b", hashedLabel("a~b", "a~b")},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := tenantLabel(c.tenant, free)
			if got != c.want {
				t.Errorf("label %q, want %q", got, c.want)
			}
			if len(got) > maxTenantLabel || !utf8.ValidString(got) {
				t.Errorf("label %q: %d bytes, valid UTF-8 %v", got, len(got), utf8.ValidString(got))
			}
		})
	}
	t.Run("a label taken by another gets a longer hash", func(t *testing.T) {
		short := hashedLabel(over[:137], over)
		got := tenantLabel(over, func(l string) bool { return l == short })
		sum := sha256.Sum256([]byte(over))
		if want := over[:maxTenantLabel-25] + "~" + hex.EncodeToString(sum[:])[:24]; got != want {
			t.Errorf("label %q, want %q", got, want)
		}
	})
}

// TestTenantsAlikeInTheirFirst150BytesKeepSeriesOfTheirOwn sends requests
// of tenants whose IDs share their first 150 bytes, and of a tenant named
// other, through the proxy to a real memcached: each must have a series of
// its own under a label that is distinct, within the budget and readable,
// where they used to fold into tenant="other".
func TestTenantsAlikeInTheirFirst150BytesKeepSeriesOfTheirOwn(t *testing.T) {
	cfg := keyspaceConfig(startMemcached(t))
	cfg.MetricsTenants = 10
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	one, two := testTenant("a", 150)+"-one", testTenant("a", 150)+"-two"
	key := func(tenant string) string { return "S:" + tenant + ":" + testBlock + ":1" }
	c := newLineClient(t, addr)
	if got := c.do("set " + key(one) + " 0 0 5\r\nhello\r\n"); got != "STORED\r\n" {
		t.Fatalf("set answered %q", got)
	}
	sends := map[string]int{one: 1, two: 2, "other": 3, "team-a": 4}
	for tenant, n := range sends {
		for range n {
			c.do("get " + key(tenant) + "\r\n")
		}
	}
	want := map[string]int{
		hashedLabel(one[:137], one):   2, // the set and the get
		hashedLabel(two[:137], two):   2,
		hashedLabel("other", "other"): 3,
		"team-a":                      4,
		otherTenant:                   0,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "mcsidecar_tenant_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			label := m.GetLabel()[0].GetValue()
			if _, dup := got[label]; dup {
				t.Errorf("two series labelled %q", label)
			}
			if len(label) > maxTenantLabel {
				t.Errorf("label of %d bytes: %q", len(label), label)
			}
			got[label] = int(m.GetCounter().GetValue())
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d tenant series, want %d: %v", len(got), len(want), got)
	}
	for label, n := range want {
		if got[label] != n {
			t.Errorf("tenant=%q counts %d requests, want %d (all: %v)", label, got[label], n, got)
		}
	}
}
