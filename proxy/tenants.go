package proxy

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// otherTenant is the label value every tenant without a slot folds into.
const otherTenant = "other"

// maxTenantLabel bounds a tenant label value; Mimir's tenant IDs are at
// most 150 bytes.
const maxTenantLabel = 150

// tenantCounters counts one tenant's requests (keys asked for or
// stored), hits among the keys asked for, and bytes stored upstream.
type tenantCounters struct {
	label                   string
	requests, hits, written atomic.Uint64
	recent                  atomic.Uint64 // requests since the last rebalance
}

func (t *tenantCounters) fold(from *tenantCounters) {
	t.requests.Add(from.requests.Load())
	t.hits.Add(from.hits.Load())
	t.written.Add(from.written.Load())
}

// tenantTable keeps per-tenant counters for the busiest tenants only, so
// the series exported stay bounded (at most max tenants and "other")
// whatever the number of tenants.
//
// The design keeps the request path cheap. The tenants with a slot sit in a
// map that is never changed, only replaced, and read through an atomic
// pointer: a request of a tenant with a slot is one lookup (string([]byte)
// in a map index does not allocate) and a few atomic adds, with no lock.
// A request of any other tenant counts in "other" and, under a mutex, in a
// space-saving sketch of max candidates (Metwally et al.: a newcomer takes
// the place of the least counted candidate and inherits its count plus
// one), which finds the heavy hitters among the rest in bounded memory.
// Slots change only at scrape time (rebalance): a candidate seen more often
// since the last scrape than the quietest tenant with a slot takes that
// slot. The evicted tenant's totals are added to "other", so the sum over
// all tenant series never goes back; the promoted tenant's series starts
// at zero. Until the table is full, a new tenant gets a slot at once.
type tenantTable struct {
	max   int
	slots atomic.Pointer[map[string]*tenantCounters]
	other tenantCounters

	mu sync.Mutex
	// cand holds the sketch's counts by pointer, so that counting a
	// candidate again is a lookup, which does not allocate, and not a map
	// assignment, which would copy the key.
	cand map[string]*uint64
}

func newTenantTable(max int) *tenantTable {
	t := &tenantTable{max: max, cand: make(map[string]*uint64, max)}
	t.other.label = otherTenant
	t.slots.Store(&map[string]*tenantCounters{})
	return t
}

// counters returns the counters of tenant, or nil for a key with no
// tenant. A tenant's counters stay valid (and counted) after it loses its
// slot: they were folded into "other" when it did, and later counts are
// lost to the per-tenant view only until the next scrape.
func (t *tenantTable) counters(tenant []byte) *tenantCounters {
	if t == nil || len(tenant) == 0 {
		return nil
	}
	if c := (*t.slots.Load())[string(tenant)]; c != nil {
		c.recent.Add(1)
		return c
	}
	return t.miss(tenant)
}

// miss handles a tenant without a slot: it gets one while the table has
// room, and otherwise counts in "other" and in the candidate sketch.
func (t *tenantTable) miss(tenant []byte) *tenantCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	slots := *t.slots.Load()
	if c := slots[string(tenant)]; c != nil {
		c.recent.Add(1)
		return c
	}
	if len(slots) < t.max {
		if c := t.addSlot(slots, string(tenant)); c != nil {
			c.recent.Add(1)
			return c
		}
		return &t.other
	}
	if n := t.cand[string(tenant)]; n != nil {
		*n++
	} else if len(t.cand) < t.max {
		one := uint64(1)
		t.cand[string(tenant)] = &one
	} else {
		least, n := "", (*uint64)(nil)
		for name, count := range t.cand {
			if n == nil || *count < *n {
				least, n = name, count
			}
		}
		delete(t.cand, least)
		*n++
		t.cand[string(tenant)] = n
	}
	return &t.other
}

// addSlot publishes a copy of slots with tenant added, and returns its
// counters; nil when its label would not be a fit label value (the same
// as another's after cleaning, or "other"). t.mu is held.
func (t *tenantTable) addSlot(slots map[string]*tenantCounters, tenant string) *tenantCounters {
	label := strings.ToValidUTF8(tenant, "\uFFFD")
	if len(label) > maxTenantLabel {
		label = strings.ToValidUTF8(label[:maxTenantLabel], "")
	}
	if label == otherTenant {
		return nil
	}
	for _, c := range slots {
		if c.label == label {
			return nil
		}
	}
	next := make(map[string]*tenantCounters, len(slots)+1)
	for name, c := range slots {
		next[name] = c
	}
	c := &tenantCounters{label: label}
	next[tenant] = c
	t.slots.Store(&next)
	return c
}

// rebalance gives the slots of the quietest tenants to busier candidates,
// and starts counting afresh. The collector calls it at every scrape.
func (t *tenantTable) rebalance() {
	t.mu.Lock()
	defer t.mu.Unlock()
	slots := *t.slots.Load()
	if len(t.cand) > 0 && len(slots) > 0 {
		type entry struct {
			name  string
			count uint64
		}
		var cands, held []entry
		for name, n := range t.cand {
			cands = append(cands, entry{name, *n})
		}
		for name, c := range slots {
			held = append(held, entry{name, c.recent.Load()})
		}
		slices.SortFunc(cands, func(a, b entry) int { return cmp.Compare(b.count, a.count) })
		slices.SortFunc(held, func(a, b entry) int { return cmp.Compare(a.count, b.count) })
		next := make(map[string]*tenantCounters, len(slots))
		for name, c := range slots {
			next[name] = c
		}
		n := 0
		for n < len(cands) && n < len(held) && cands[n].count > held[n].count {
			t.other.fold(next[held[n].name])
			delete(next, held[n].name)
			n++
		}
		t.slots.Store(&next)
		for _, c := range cands[:n] {
			t.addSlot(*t.slots.Load(), c.name)
		}
	}
	for _, c := range *t.slots.Load() {
		c.recent.Store(0)
	}
	clear(t.cand)
}

// snapshot returns the counters of every tenant with a slot, then "other".
func (t *tenantTable) snapshot() []*tenantCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*tenantCounters
	for _, c := range *t.slots.Load() {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *tenantCounters) int { return strings.Compare(a.label, b.label) })
	return append(out, &t.other)
}

// tenantDescs are the per-tenant metrics.
type tenantDescs struct {
	requests, hits, written *prometheus.Desc
}

func newTenantDescs(ns string) tenantDescs {
	const help = " The busiest --metrics-tenants tenants have their own series, the rest are counted as tenant=\"other\"."
	return tenantDescs{
		requests: prometheus.NewDesc(ns+"_tenant_requests_total", "Keys asked for or stored, by the tenant their key scheme names."+help, []string{"tenant"}, nil),
		hits:     prometheus.NewDesc(ns+"_tenant_hits_total", "Keys asked for and found, by tenant."+help, []string{"tenant"}, nil),
		written:  prometheus.NewDesc(ns+"_tenant_written_bytes_total", "Bytes of values stored upstream (as memcached holds them), by tenant."+help, []string{"tenant"}, nil),
	}
}

func (d tenantDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.requests
	ch <- d.hits
	ch <- d.written
}

// collect exports the table, then rebalances it for the next scrape.
func (d tenantDescs) collect(ch chan<- prometheus.Metric, t *tenantTable) {
	if t == nil {
		return
	}
	for _, c := range t.snapshot() {
		ch <- prometheus.MustNewConstMetric(d.requests, prometheus.CounterValue, float64(c.requests.Load()), c.label)
		ch <- prometheus.MustNewConstMetric(d.hits, prometheus.CounterValue, float64(c.hits.Load()), c.label)
		ch <- prometheus.MustNewConstMetric(d.written, prometheus.CounterValue, float64(c.written.Load()), c.label)
	}
	t.rebalance()
}
