package stats

import "testing"

// A tally adds to the proxy's and each tenant's counters what counting key
// by key would have, whatever order the tenants' keys come in.
func TestKeyTallyCountsAsKeyByKey(t *testing.T) {
	st := New()
	a, b := &TenantCounters{Label: "a"}, &TenantCounters{Label: "b"}
	keys := []struct {
		tenant *TenantCounters
		hit    bool
	}{{a, true}, {a, false}, {b, true}, {nil, true}, {a, true}, {nil, false}, {b, false}}
	get := Tally{}
	for _, k := range keys {
		get.Add(k.tenant, k.hit)
	}
	get.Flush(st)
	gat := Tally{Touch: true}
	gat.Add(b, true)
	gat.Add(nil, false)
	gat.Flush(st)
	gat.Flush(st) // flushed twice: the second adds nothing

	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"cmd_get", st.CmdGet.Load(), 7}, {"get_hits", st.GetHits.Load(), 4}, {"get_misses", st.GetMisses.Load(), 3},
		{"cmd_touch", st.CmdTouch.Load(), 2}, {"touch_hits", st.TouchHits.Load(), 1}, {"touch_misses", st.TouchMisses.Load(), 1},
		{"a requests", a.Requests.Load(), 3}, {"a hits", a.Hits.Load(), 2},
		{"b requests", b.Requests.Load(), 3}, {"b hits", b.Hits.Load(), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}
