package proxy

import "testing"

// A tally adds to the proxy's and each tenant's counters what counting key
// by key would have, whatever order the tenants' keys come in.
func TestKeyTallyCountsAsKeyByKey(t *testing.T) {
	st := newStats()
	a, b := &tenantCounters{label: "a"}, &tenantCounters{label: "b"}
	keys := []struct {
		tenant *tenantCounters
		hit    bool
	}{{a, true}, {a, false}, {b, true}, {nil, true}, {a, true}, {nil, false}, {b, false}}
	get := keyTally{}
	for _, k := range keys {
		get.add(k.tenant, k.hit)
	}
	get.flush(st)
	gat := keyTally{touch: true}
	gat.add(b, true)
	gat.add(nil, false)
	gat.flush(st)
	gat.flush(st) // flushed twice: the second adds nothing

	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"cmd_get", st.cmdGet.Load(), 7}, {"get_hits", st.getHits.Load(), 4}, {"get_misses", st.getMisses.Load(), 3},
		{"cmd_touch", st.cmdTouch.Load(), 2}, {"touch_hits", st.touchHits.Load(), 1}, {"touch_misses", st.touchMisses.Load(), 1},
		{"a requests", a.requests.Load(), 3}, {"a hits", a.hits.Load(), 2},
		{"b requests", b.requests.Load(), 3}, {"b hits", b.hits.Load(), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}
