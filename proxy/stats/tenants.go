package stats

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// otherTenant is the label value every tenant without a slot folds into.
const otherTenant = "other"

// maxTenantLabel bounds a tenant label value; Mimir's tenant IDs are at
// most 150 bytes.
const maxTenantLabel = 150

// tenantHashChars is how many hex digits of the SHA-256 of a tenant ID end
// its label when the ID cannot be its own label: 48 bits, so two tenants
// of one proxy share them only by a chance too small to matter, and
// tenantLabel lengthens them if that chance comes up anyway.
const tenantHashChars = 12

// TenantLabel returns the label of tenant when labels given before are
// taken: the ID itself when it is one (valid UTF-8, at most
// maxTenantLabel bytes, not otherTenant, without '~'); otherwise as much
// of the ID as fits, readable, then '~' and a hash of the whole ID, so
// that IDs alike in their first bytes keep labels of their own. An ID
// holding '~' is hashed too, so that no ID as it is can equal another's
// hashed label. It returns "" only when two IDs hash alike in all of
// SHA-256.
func TenantLabel(tenant string, taken func(string) bool) string {
	if len(tenant) <= maxTenantLabel && utf8.ValidString(tenant) && tenant != otherTenant && !strings.Contains(tenant, "~") {
		if taken(tenant) {
			return ""
		}
		return tenant
	}
	readable := strings.ToValidUTF8(tenant, "\uFFFD")
	sum := sha256.Sum256([]byte(tenant))
	hash := hex.EncodeToString(sum[:])
	for _, n := range []int{tenantHashChars, 2 * tenantHashChars, len(hash)} {
		prefix := readable
		if room := maxTenantLabel - 1 - n; len(prefix) > room {
			prefix = strings.ToValidUTF8(prefix[:room], "")
		}
		if label := prefix + "~" + hash[:n]; !taken(label) {
			return label
		}
	}
	return ""
}

// TenantCounters counts one tenant's requests (keys asked for or
// stored), hits among the keys asked for, and bytes stored upstream.
type TenantCounters struct {
	Label                   string
	Requests, Hits, Written atomic.Uint64
	recent                  atomic.Uint64 // requests since the last rebalance
}

func (t *TenantCounters) fold(from *TenantCounters) {
	t.Requests.Add(from.Requests.Load())
	t.Hits.Add(from.Hits.Load())
	t.Written.Add(from.Written.Load())
}

// Tenants keeps per-tenant counters for the busiest tenants only, so
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
// slot. The evicted tenant's totals are added to "other" (and the tenant
// to folded), so the sum over all tenant series never goes back; the promoted tenant's series starts
// at zero. Until the table is full, a new tenant gets a slot at once.
type Tenants struct {
	max   int
	slots atomic.Pointer[map[string]*TenantCounters]
	other TenantCounters
	// folded counts the tenants that lost their slot to a busier one.
	folded atomic.Uint64

	mu sync.Mutex
	// cand holds the sketch's counts by pointer, so that counting a
	// candidate again is a lookup, which does not allocate, and not a map
	// assignment, which would copy the key.
	cand map[string]*uint64
}

func NewTenants(max int) *Tenants {
	t := &Tenants{max: max, cand: make(map[string]*uint64, max)}
	t.other.Label = otherTenant
	t.slots.Store(&map[string]*TenantCounters{})
	return t
}

// Counters returns the counters of tenant, or nil for a key with no
// tenant. A tenant's counters stay valid (and counted) after it loses its
// slot: they were folded into "other" when it did, and later counts are
// lost to the per-tenant view only until the next scrape.
func (t *Tenants) Counters(tenant []byte) *TenantCounters {
	if t == nil || len(tenant) == 0 {
		return nil
	}
	if c := (*t.slots.Load())[string(tenant)]; c != nil {
		c.recent.Add(1)
		return c
	}
	return t.miss(tenant)
}

// A TenantRun finds the counters of a request's keys, which mostly share
// one tenant: a key of the same tenant as the one before takes its
// counters without a lookup (hashing a 150-byte tenant), and the run's
// keys are added to the tenant's recent count at once, not one atomic
// add each, which the event loops would contend for.
type TenantRun struct {
	tenant []byte
	c      *TenantCounters
	keys   uint64 // keys of the run after the first, not yet counted in c.recent
}

// Counters returns the counters of tenant, as Tenants.Counters does.
func (r *TenantRun) Counters(t *Tenants, tenant []byte) *TenantCounters {
	if r.c != nil && bytes.Equal(tenant, r.tenant) {
		r.keys++
		return r.c
	}
	r.End()
	r.tenant, r.c = tenant, t.Counters(tenant)
	return r.c
}

// End counts the run's keys.
func (r *TenantRun) End() {
	if r.c != nil && r.keys > 0 {
		r.c.recent.Add(r.keys)
	}
	r.keys = 0
}

// miss handles a tenant without a slot: it gets one while the table has
// room, and otherwise counts in "other" and in the candidate sketch.
func (t *Tenants) miss(tenant []byte) *TenantCounters {
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
// counters; nil only when no label of its own can be found for it (see
// tenantLabel). t.mu is held.
func (t *Tenants) addSlot(slots map[string]*TenantCounters, tenant string) *TenantCounters {
	label := TenantLabel(tenant, func(l string) bool {
		for _, c := range slots {
			if c.Label == l {
				return true
			}
		}
		return false
	})
	if label == "" {
		return nil
	}
	next := make(map[string]*TenantCounters, len(slots)+1)
	for name, c := range slots {
		next[name] = c
	}
	c := &TenantCounters{Label: label}
	next[tenant] = c
	t.slots.Store(&next)
	return c
}

// Rebalance gives the slots of the quietest tenants to busier candidates,
// and starts counting afresh. The collector calls it at every scrape.
func (t *Tenants) Rebalance() {
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
		next := make(map[string]*TenantCounters, len(slots))
		for name, c := range slots {
			next[name] = c
		}
		n := 0
		for n < len(cands) && n < len(held) && cands[n].count > held[n].count {
			t.other.fold(next[held[n].name])
			delete(next, held[n].name)
			t.folded.Add(1)
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

// Snapshot returns the counters of every tenant with a slot, then "other".
func (t *Tenants) Snapshot() []*TenantCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*TenantCounters
	for _, c := range *t.slots.Load() {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *TenantCounters) int { return strings.Compare(a.Label, b.Label) })
	return append(out, &t.other)
}

// TenantDescs are the per-tenant metrics.
type TenantDescs struct {
	requests, hits, written, folded *prometheus.Desc
}

func NewTenantDescs(ns string) TenantDescs {
	const help = " The busiest --metrics-tenants tenants have their own series, the rest are counted as tenant=\"other\";" +
		" a tenant ID over 150 bytes, not valid UTF-8, holding '~' or named other is labelled with its first bytes, '~' and 12 hex digits of its SHA-256."
	return TenantDescs{
		requests: prometheus.NewDesc(ns+"_tenant_requests_total", "Keys asked for or stored, by the tenant their key scheme names."+help, []string{"tenant"}, nil),
		hits:     prometheus.NewDesc(ns+"_tenant_hits_total", "Keys asked for and found, by tenant."+help, []string{"tenant"}, nil),
		written:  prometheus.NewDesc(ns+"_tenant_written_bytes_total", "Bytes of values stored upstream (as memcached holds them), by tenant."+help, []string{"tenant"}, nil),
		folded: prometheus.NewDesc(ns+"_tenants_folded_total", "Tenants whose series were folded into tenant=\"other\": at a scrape, a tenant with a series of its own"+
			" that made fewer requests since the previous scrape than a tenant without one gives it its place, and its totals are added to other.", nil, nil),
	}
}

func (d TenantDescs) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.requests
	ch <- d.hits
	ch <- d.written
	ch <- d.folded
}

// Collect exports the table, then rebalances it for the next scrape.
func (d TenantDescs) Collect(ch chan<- prometheus.Metric, t *Tenants) {
	if t == nil {
		return
	}
	for _, c := range t.Snapshot() {
		ch <- prometheus.MustNewConstMetric(d.requests, prometheus.CounterValue, float64(c.Requests.Load()), c.Label)
		ch <- prometheus.MustNewConstMetric(d.hits, prometheus.CounterValue, float64(c.Hits.Load()), c.Label)
		ch <- prometheus.MustNewConstMetric(d.written, prometheus.CounterValue, float64(c.Written.Load()), c.Label)
	}
	ch <- prometheus.MustNewConstMetric(d.folded, prometheus.CounterValue, float64(t.folded.Load()))
	t.Rebalance()
}
