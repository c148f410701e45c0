package proxy

import (
	"mcsidecar/proxy/stats"
	"testing"
)

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
	// The label rules are stats.TenantLabel's (tested there); here each
	// tenant must get its own, first come first labelled.
	label := func(tenant string) string { return stats.TenantLabel(tenant, func(string) bool { return false }) }
	want := map[string]int{
		label(one):     2, // the set and the get
		label(two):     2,
		label("other"): 3,
		"team-a":       4,
		"other":        0, // every tenant without a series of its own
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
			if len(label) > 150 { // Mimir's longest tenant ID
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
