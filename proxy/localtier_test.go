package proxy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"mcsidecar/codec"
	"mcsidecar/proxy/zones"
)

// tierTestSize is the local tier's size in the tests: far more than they
// store, so nothing is evicted.
const tierTestSize = 64 << 20

// tierConfig is keyspaceConfig (codec and key schemes on) with the local
// tier on, size bytes.
func tierConfig(size ByteSize, upstreams ...string) Config {
	cfg := keyspaceConfig(upstreams...)
	cfg.LocalCacheSize = size
	return cfg
}

// tierKey is a Mimir postings key of tenant "tenant-a" in block testBlock:
// immutable, and enveloped (P2: is a postings prefix).
func tierKey(name string) string { return "P2:tenant-a:" + testBlock + ":" + name }

// resultsKey is a query-frontend results key: its value may change, so
// the tier never keeps it.
func resultsKey(name string) string { return "1@QS:team_a|team_b:" + name }

// metricValue returns the value of the counter or gauge name whose labels
// are exactly labels (name, value pairs), and whether there is one.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func tierHits(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return counterWith(t, reg, "mcsidecar_local_cache_reads_total", "result", "hit")
}

func tierEntries(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return counterWith(t, reg, "mcsidecar_local_cache_entries")
}

// tierValue is a value of n bytes, different for every seed, that looks
// like text: it compresses somewhat, as index-cache values do.
func tierValue(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		if rng.IntN(8) == 0 {
			b[i] = ' '
		} else {
			b[i] = '0' + byte(rng.IntN(10))
		}
	}
	return string(b)
}

// casOf returns the CAS of the one item a gets reply holds.
func casOf(t *testing.T, reply string) string {
	t.Helper()
	head, _, _ := strings.Cut(reply, "\r\n")
	f := strings.Fields(head)
	if len(f) != 5 || f[0] != "VALUE" {
		t.Fatalf("gets reply without a CAS: %q", short(reply))
	}
	return f[4]
}

func TestLocalTierServesImmutableHitsWithoutUpstream(t *testing.T) {
	const n, m, rounds = 20, 10, 4
	up := startMemcached(t)
	cfg := tierConfig(tierTestSize, up)
	cfg.MetricsTenants = 10
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)

	var keys, values []string
	for i := range n - 1 {
		keys = append(keys, tierKey("postings-"+strconv.Itoa(i)))
	}
	// A key too long for memcached, rewritten upstream: the tier holds it
	// under its upstream key.
	keys = append(keys, mimirLV2Key())
	for i := range m {
		keys = append(keys, resultsKey("query-"+strconv.Itoa(i)))
	}
	for i, k := range keys {
		values = append(values, tierValue(uint64(i), 200+i*37))
		if r := sc.do(fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", k, i, len(values[i]), values[i])); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
	}
	// Every get is counted against memcached's own get_hits, so each
	// key's trips upstream are known exactly.
	reached := make([]int, len(keys))
	hits := direct.stat("get_hits")
	for range rounds {
		for i, k := range keys {
			if r := sc.do("get " + k + "\r\n"); r != valueReply(k, uint32(i), values[i]) {
				t.Fatalf("get %s: %q", k, short(r))
			}
			now := direct.stat("get_hits")
			reached[i] += int(now - hits)
			hits = now
		}
	}
	for i, k := range keys {
		want := rounds
		if i < n {
			want = 1
		}
		if reached[i] != want {
			t.Errorf("%s reached memcached %d times in %d gets, want %d", k, reached[i], rounds, want)
		}
	}
	if misses := direct.stat("get_misses"); misses != 0 {
		t.Errorf("memcached counted %d misses", misses)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"mcsidecar_local_cache_reads_total", []string{"result", "hit"}, n * (rounds - 1)},
		{"mcsidecar_local_cache_reads_total", []string{"result", "miss"}, n},
		{"mcsidecar_local_cache_refused_mutable_total", nil, m * rounds},
		{"mcsidecar_local_cache_evictions_total", nil, 0},
		{"mcsidecar_local_cache_entries", nil, n},
		{"mcsidecar_local_cache_limit_bytes", nil, tierTestSize},
		// Tier hits are hits of the tenant.
		{"mcsidecar_tenant_hits_total", []string{"tenant", "tenant-a"}, (n - 1) * rounds},
		{"mcsidecar_tenant_hits_total", []string{"tenant", testTenant("acme", 150)}, rounds},
	} {
		if got := counterWith(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	held := counterWith(t, reg, "mcsidecar_local_cache_bytes")
	var least int
	for i := range n {
		least += len(keys[i]) + len(values[i])
	}
	if held < float64(least) || held > float64(least+n*(250+1024)) {
		t.Errorf("mcsidecar_local_cache_bytes = %v for %d entries of %d bytes of keys and values", held, n, least)
	}

	st := statsOf(t, sc)
	for name, want := range map[string]int{
		"local_cache_hits":            n * (rounds - 1),
		"local_cache_misses":          n,
		"local_cache_refused_mutable": m * rounds,
		"local_cache_evictions":       0,
		"local_cache_entries":         n,
		"local_cache_limit_bytes":     tierTestSize,
		"get_hits":                    (n + m) * rounds,
		"get_misses":                  0,
	} {
		if st[name] != strconv.Itoa(want) {
			t.Errorf("stats %s = %q, want %d", name, st[name], want)
		}
	}

	// A multi-get mixing tier hits, upstream hits and a miss answers in
	// request order, duplicates repeated.
	req := []string{keys[0], keys[n], "P2:tenant-a:" + testBlock + ":absent", keys[1], keys[0]}
	var want strings.Builder
	for _, k := range req {
		if i := slices.Index(keys, k); i >= 0 {
			fmt.Fprintf(&want, "VALUE %s %d %d\r\n%s\r\n", k, i, len(values[i]), values[i])
		}
	}
	want.WriteString("END\r\n")
	before := direct.stat("get_hits")
	if r := sc.do("get " + strings.Join(req, " ") + "\r\n"); r != want.String() {
		t.Errorf("multi-get: %q, want %q", short(r), short(want.String()))
	}
	if d := direct.stat("get_hits") - before; d != 1 {
		t.Errorf("multi-get reached memcached for %d hits, want 1 (the results key)", d)
	}
}

func TestLocalTierSeesWritesAtOnce(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, tierConfig(tierTestSize, up))
	reg := registry(t, p)
	// The oracle is a sidecar without a tier on the same memcached: it
	// shows memcached's current state, values decoded.
	_, oracleAddr := startProxy(t, keyspaceConfig(up))
	sc, oracle, direct := newLineClient(t, addr), newLineClient(t, oracleAddr), newLineClient(t, up)

	rng := rand.New(rand.NewPCG(1, 2))
	tooLarge := make([]byte, 1<<20+1000)
	for i := range tooLarge {
		tooLarge[i] = byte(rng.Uint32())
	}

	cases := []struct {
		name  string
		value string
		// write changes key through the sidecar and checks its reply.
		write func(t *testing.T, key string) string
		want  string // the value afterwards; "" for none
	}{
		{"set", "old", func(t *testing.T, key string) string { return sc.do(setReq("set", key, "new")) }, "new"},
		{"set noreply", "old", func(t *testing.T, key string) string {
			return sc.do(fmt.Sprintf("set %s 0 0 3 noreply\r\nnew\r\nversion\r\n", key))
		}, "new"},
		{"set too large", "old", func(t *testing.T, key string) string {
			return sc.do(fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", key, len(tooLarge), tooLarge))
		}, ""},
		{"replace", "old", func(t *testing.T, key string) string { return sc.do(setReq("replace", key, "new")) }, "new"},
		{"add after delete", "old", func(t *testing.T, key string) string {
			// Deleted straight in memcached, which the tier does not
			// see: the add must still drop the entry.
			if r := direct.do("delete " + key + "\r\n"); r != "DELETED\r\n" {
				t.Fatalf("direct delete: %q", r)
			}
			return sc.do(setReq("add", key, "new"))
		}, "new"},
		{"delete", "old", func(t *testing.T, key string) string { return sc.do("delete " + key + "\r\n") }, ""},
		{"delete noreply", "old", func(t *testing.T, key string) string {
			return sc.do("delete " + key + " noreply\r\nversion\r\n")
		}, ""},
		{"flush_all", "old", func(t *testing.T, key string) string { return sc.do("flush_all\r\n") }, ""},
		{"flush_all 0", "old", func(t *testing.T, key string) string { return sc.do("flush_all 0\r\n") }, ""},
		{"touch to the past", "old", func(t *testing.T, key string) string { return sc.do("touch " + key + " -1\r\n") }, ""},
		{"gat to the past", "old", func(t *testing.T, key string) string { return sc.do("gat -1 " + key + "\r\n") }, ""},
		{"gats to the past", "old", func(t *testing.T, key string) string { return sc.do("gats -1 " + key + "\r\n") }, ""},
		{"incr", "10", func(t *testing.T, key string) string { return sc.do("incr " + key + " 5\r\n") }, "15"},
		{"decr", "10", func(t *testing.T, key string) string { return sc.do("decr " + key + " 3\r\n") }, "7 "},
		{"append", "old", func(t *testing.T, key string) string { return sc.do(setReq("append", key, "+new")) }, "old+new"},
		{"prepend", "old", func(t *testing.T, key string) string { return sc.do(setReq("prepend", key, "new+")) }, "new+old"},
		{"cas after gets", "old", func(t *testing.T, key string) string {
			cas := casOf(t, sc.do("gets "+key+"\r\n"))
			return sc.do(fmt.Sprintf("cas %s 0 0 3 %s\r\nnew\r\n", key, cas))
		}, "new"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := tierKey("write-" + strconv.Itoa(i))
			if r := sc.do(setReq("set", key, c.value)); r != "STORED\r\n" {
				t.Fatalf("set: %q", r)
			}
			// Warm: the first get fills the tier, the second is its hit.
			sc.do("get " + key + "\r\n")
			hits := tierHits(t, reg)
			if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, c.value) {
				t.Fatalf("warm get: %q", r)
			}
			if tierHits(t, reg) != hits+1 {
				t.Fatalf("the tier did not answer the second get")
			}
			reply := c.write(t, key)
			t.Logf("%s answered %q", c.name, short(reply))

			want := "END\r\n"
			if c.want != "" {
				want = valueReply(key, 0, c.want)
			}
			if r := oracle.do("get " + key + "\r\n"); r != want {
				t.Fatalf("memcached holds %q after %s, the test wants %q", short(r), c.name, short(want))
			}
			_, _, held := rawItem(t, direct, key)
			if held != (c.want != "") {
				t.Fatalf("memcached holds the item: %v, want %v", held, c.want != "")
			}
			for range 2 { // the second may come from the tier refilled
				if r := sc.do("get " + key + "\r\n"); r != want {
					t.Fatalf("get after %s: %q, memcached holds %q", c.name, short(r), short(want))
				}
			}
		})
	}

	// A delayed flush_all empties the tier, and keeps it from filling
	// until memcached has acted on it: memcached still serves the item
	// meanwhile, from upstream, and never after it dropped it.
	t.Run("flush_all 2", func(t *testing.T) {
		key := tierKey("flush-later")
		if r := sc.do(setReq("set", key, "old")); r != "STORED\r\n" {
			t.Fatalf("set: %q", r)
		}
		sc.do("get " + key + "\r\n")
		flushed := time.Now()
		if r := sc.do("flush_all 2\r\n"); r != "OK\r\n" {
			t.Fatalf("flush_all 2: %q", r)
		}
		hits := tierHits(t, reg)
		for range 2 { // neither fills the tier
			if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, "old") {
				t.Fatalf("get before the flush: %q", r)
			}
		}
		if tierHits(t, reg) != hits {
			t.Fatalf("the tier answered while a flush_all was pending")
		}
		// memcached's clock counts whole seconds: it drops the items up
		// to two seconds before the delay runs out by the wall clock.
		if !waitFor(3*time.Second, func() bool { _, _, ok := rawItem(t, direct, key); return !ok }) {
			t.Fatal("memcached still holds the item 3s after flush_all 2")
		}
		dropped := time.Since(flushed)
		stale := sc.do("get " + key + "\r\n")
		time.Sleep(time.Until(flushed.Add(2*time.Second + 500*time.Millisecond)))
		if r := sc.do("get " + key + "\r\n"); r != "END\r\n" {
			t.Fatalf("get after the delay of the flush ran out: %q", short(r))
		}
		if stale != "END\r\n" {
			t.Errorf("memcached dropped the item %v after flush_all 2, the sidecar still served %q", dropped.Round(time.Millisecond), short(stale))
		}
	})
}

// TestLocalTierWriteDuringGetLeavesNoStaleEntry writes a key through the
// sidecar while other clients get it: once the last write is answered, a
// get must show what memcached holds.
func TestLocalTierWriteDuringGetLeavesNoStaleEntry(t *testing.T) {
	up := startMemcached(t)
	_, addr := startProxy(t, tierConfig(tierTestSize, up))
	_, oracleAddr := startProxy(t, keyspaceConfig(up))
	w, oracle := newLineClient(t, addr), newLineClient(t, oracleAddr)
	readers := make([]*lineClient, 4)
	for i := range readers {
		readers[i] = newLineClient(t, addr)
	}
	const trials, writes = 60, 20
	stale := 0
	var first string
	for trial := range trials {
		key := tierKey("race-" + strconv.Itoa(trial))
		w.do(setReq("set", key, "v0"))
		var stop atomic.Bool
		var wg sync.WaitGroup
		for _, r := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					r.do("get " + key + "\r\n")
				}
			}()
		}
		for i := 1; i <= writes; i++ {
			if i == writes && trial%2 == 1 {
				w.do("delete " + key + "\r\n")
			} else {
				w.do(setReq("set", key, "v"+strconv.Itoa(i)))
			}
		}
		stop.Store(true)
		wg.Wait()
		got, want := w.do("get "+key+"\r\n"), oracle.do("get "+key+"\r\n")
		if got != want {
			if stale == 0 {
				first = fmt.Sprintf("served %q, memcached holds %q", got, want)
			}
			stale++
		}
	}
	if stale > 0 {
		t.Errorf("%d of %d keys written during gets kept a stale entry; first: %s", stale, trials, first)
	}
}

// TestLocalTierStaysWithinItsSize fills a small tier past its size: it
// evicts, counts the evictions, and never keeps an entry over 1/16 of it.
func TestLocalTierStaysWithinItsSize(t *testing.T) {
	const size = 64 << 10
	up := startMemcached(t)
	p, addr := startProxy(t, tierConfig(size, up))
	reg := registry(t, p)
	sc := newLineClient(t, addr)
	for i := range 100 {
		key, value := tierKey("fill-"+strconv.Itoa(i)), tierValue(uint64(i), 2048)
		sc.do(setReq("set", key, value))
		if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, value) {
			t.Fatalf("get: %q", short(r))
		}
	}
	if held := counterWith(t, reg, "mcsidecar_local_cache_bytes"); held > size || held == 0 {
		t.Errorf("the tier holds %v bytes, its size is %d", held, size)
	}
	if ev := counterWith(t, reg, "mcsidecar_local_cache_evictions_total"); ev == 0 {
		t.Error("no eviction counted")
	}
	if e := tierEntries(t, reg); e == 0 || e > size/2048 {
		t.Errorf("%v entries of 2 KiB in a tier of %d bytes", e, size)
	}
	big, value := tierKey("big"), tierValue(7, size/16)
	sc.do(setReq("set", big, value))
	hits := tierHits(t, reg)
	for range 2 {
		if r := sc.do("get " + big + "\r\n"); r != valueReply(big, 0, value) {
			t.Fatalf("get: %q", short(r))
		}
	}
	if tierHits(t, reg) != hits {
		t.Errorf("an entry over 1/16 of the tier was kept")
	}
}

func TestLocalTierHonoursTTL(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, tierConfig(tierTestSize, up))
	reg := registry(t, p)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)

	// An item of one second left is never kept.
	short1 := tierKey("ttl-1")
	if r := sc.do(fmt.Sprintf("set %s 0 1 2\r\nv1\r\n", short1)); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	hits := tierHits(t, reg)
	upHits := direct.stat("get_hits")
	served := 0
	for range 3 {
		if r := sc.do("get " + short1 + "\r\n"); r == valueReply(short1, 0, "v1") {
			served++
		} else if r != "END\r\n" {
			t.Fatalf("get: %q", r)
		}
	}
	if got := tierHits(t, reg); got != hits {
		t.Errorf("an item set with exptime 1 was served %v times by the tier", got-hits)
	}
	if got := direct.stat("get_hits") - upHits; got != uint64(served) {
		t.Errorf("%d hits served, %d reached memcached", served, got)
	}
	if e := tierEntries(t, reg); e != 0 {
		t.Errorf("the tier holds %v entries, want none", e)
	}

	// An item of 3 seconds is kept, and no longer than memcached keeps it.
	key := tierKey("ttl-3")
	if r := sc.do(fmt.Sprintf("set %s 0 3 2\r\nv3\r\n", key)); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	hits = tierHits(t, reg)
	for range 2 {
		if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, "v3") {
			t.Fatalf("get: %q", r)
		}
	}
	if tierHits(t, reg) != hits+1 {
		t.Fatal("an item with 3 seconds to live was not served by the tier")
	}
	if !waitFor(6*time.Second, func() bool { _, _, ok := rawItem(t, direct, key); return !ok }) {
		t.Fatal("memcached still holds the item after 6s")
	}
	if r := sc.do("get " + key + "\r\n"); r != "END\r\n" {
		t.Fatalf("get after memcached expired the item: %q", r)
	}

	// An entry expires a second before the time to live memcached gave
	// when it was read; one without an exptime never does.
	long, forever := tierKey("ttl-10"), tierKey("ttl-0")
	began := time.Now()
	sc.do(fmt.Sprintf("set %s 0 10 2\r\nvA\r\n", long))
	sc.do(fmt.Sprintf("set %s 0 0 2\r\nv0\r\n", forever))
	if r := sc.do("get " + long + " " + forever + "\r\n"); r != "VALUE "+long+" 0 2\r\nvA\r\nVALUE "+forever+" 0 2\r\nv0\r\nEND\r\n" {
		t.Fatalf("get: %q", r)
	}
	ended := time.Now()
	e, ok := p.tier.Get(long, ended.UnixNano())
	if !ok {
		t.Fatal("an item with 10 seconds to live is not in the tier")
	}
	if lo, hi := began.Add(8*time.Second), ended.Add(9*time.Second); e.Expires < lo.UnixNano() || e.Expires > hi.UnixNano() {
		t.Errorf("entry expires %v after the set, want 8s after the set to 9s after the get", time.Duration(e.Expires-began.UnixNano()))
	}
	if e, ok := p.tier.Get(forever, ended.UnixNano()); !ok || e.Expires != 0 {
		t.Errorf("an item without exptime: in the tier %v, expires %v, want never", ok, e)
	}
}

func TestLocalTierNeverKeepsAFailedVerification(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, tierConfig(tierTestSize, up))
	reg := registry(t, p)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)

	key, other := tierKey("verify"), tierKey("verify-other")
	value := strings.Repeat("postings 1234567 ", 20)
	for _, k := range []string{key, other} {
		if r := sc.do(fmt.Sprintf("set %s 7 0 %d\r\n%s\r\n", k, len(value), value)); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
	}
	flags, stored, ok := rawItem(t, direct, key)
	if !ok || flags&(1<<codec.DefaultFlagBit) == 0 {
		t.Fatalf("%s is stored with flags %d, not enveloped", key, flags)
	}
	_, otherStored, _ := rawItem(t, direct, other)
	flipped := []byte(stored)
	flipped[len(flipped)/2] ^= 0x01

	for _, bad := range []struct{ name, data string }{
		{"a flipped byte", string(flipped)},
		{"a plain value under the envelope's flag", value},
		{"the envelope of another key", otherStored},
		{"a truncated envelope", stored[:len(stored)/2]},
	} {
		rawSet(t, direct, key, flags, bad.data)
		upHits := direct.stat("get_hits")
		for _, verb := range []string{"get", "gets", "get"} {
			if r := sc.do(verb + " " + key + "\r\n"); r != "END\r\n" {
				t.Fatalf("%s of %s: served %q", verb, bad.name, short(r))
			}
		}
		if got := direct.stat("get_hits") - upHits; got != 3 {
			t.Errorf("%s: %d of 3 reads reached memcached", bad.name, got)
		}
		if e := tierEntries(t, reg); e != 0 {
			t.Errorf("%s: the tier holds %v entries", bad.name, e)
		}
	}
	if h := tierHits(t, reg); h != 0 {
		t.Errorf("the tier answered %v gets of damaged items", h)
	}

	// The intact item is kept, and served as it is.
	rawSet(t, direct, key, flags, stored)
	for range 2 {
		if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 7, value) {
			t.Fatalf("intact item: %q", short(r))
		}
	}
	if h, e := tierHits(t, reg), tierEntries(t, reg); h != 1 || e != 1 {
		t.Errorf("intact item: %v tier hits, %v entries, want 1 and 1", h, e)
	}
}

func TestLocalTierGetsCASWorks(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, tierConfig(tierTestSize, up))
	reg := registry(t, p)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)

	key := tierKey("cas")
	if r := sc.do(setReq("set", key, "first")); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	for range 2 {
		sc.do("get " + key + "\r\n")
	}
	if h := tierHits(t, reg); h != 1 {
		t.Fatalf("tier hits %v after warming, want 1", h)
	}
	r := sc.do("gets " + key + "\r\n")
	cas := casOf(t, r)
	if want := casOf(t, direct.do("gets "+key+"\r\n")); cas != want || cas == "0" {
		t.Fatalf("gets through the sidecar: CAS %s, memcached's is %s", cas, want)
	}
	if r != fmt.Sprintf("VALUE %s 0 5 %s\r\nfirst\r\nEND\r\n", key, cas) {
		t.Fatalf("gets: %q", r)
	}
	if h := tierHits(t, reg); h != 1 {
		t.Errorf("gets was answered by the tier")
	}
	if r := sc.do(fmt.Sprintf("cas %s 0 0 6 %s\r\nsecond\r\n", key, cas)); r != "STORED\r\n" {
		t.Fatalf("cas with the token gets gave: %q", r)
	}
	if r := sc.do(fmt.Sprintf("cas %s 0 0 5 %s\r\nthird\r\n", key, cas)); r != "EXISTS\r\n" {
		t.Fatalf("cas with a spent token: %q", r)
	}
	if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, "second") {
		t.Fatalf("get after cas: %q", r)
	}

	// gets fills the tier: a get that follows is its hit, and gets still
	// shows memcached's current CAS.
	key2 := tierKey("cas-2")
	sc.do(setReq("set", key2, "v"))
	cas2 := casOf(t, sc.do("gets "+key2+"\r\n"))
	hits := tierHits(t, reg)
	if r := sc.do("get " + key2 + "\r\n"); r != valueReply(key2, 0, "v") || tierHits(t, reg) != hits+1 {
		t.Errorf("get after gets: %q, tier hits %v, want %v", r, tierHits(t, reg), hits+1)
	}
	if r := sc.do(fmt.Sprintf("cas %s 0 0 1 %s\r\nw\r\n", key2, cas2)); r != "STORED\r\n" {
		t.Fatalf("cas: %q", r)
	}
	if c := casOf(t, sc.do("gets "+key2+"\r\n")); c == cas2 || c != casOf(t, direct.do("gets "+key2+"\r\n")) {
		t.Errorf("gets after cas: CAS %s (was %s)", c, cas2)
	}
}

func TestLocalTierOffChangesNothing(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, keyspaceConfig(up))
	reg := registry(t, p)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)

	key := tierKey("off")
	if r := sc.do(setReq("set", key, "value")); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	before := direct.stat("get_hits")
	const rounds = 5
	for range rounds {
		if r := sc.do("get " + key + "\r\n"); r != valueReply(key, 0, "value") {
			t.Fatalf("get: %q", r)
		}
	}
	if got := direct.stat("get_hits") - before; got != rounds {
		t.Errorf("%d of %d gets reached memcached", got, rounds)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "mcsidecar_local_cache") {
			t.Errorf("metric %s exported with the tier off", mf.GetName())
		}
	}
	for name := range statsOf(t, sc) {
		if strings.HasPrefix(name, "local_cache") {
			t.Errorf("stats %s with the tier off", name)
		}
	}
	// Without key schemes there is no telling what never changes.
	cfg := testConfig(up)
	cfg.LocalCacheSize = tierTestSize
	if _, err := New(cfg, "test", nil); err == nil {
		t.Error("New took a local tier without key schemes")
	}
}

func TestLocalTierWithZones(t *testing.T) {
	za, zb := startZone(t, 1), startZone(t, 1)
	entries := []string{zoneEntry("a", za), zoneEntry("b", zb)}
	cfgA := zonedConfig("a", entries...)
	cfgA.Codec, cfgA.Keys, cfgA.LocalCacheSize = codecConfig(), keysConfig(), tierTestSize
	p, addrA := startProxy(t, cfgA)
	reg := registry(t, p)
	// Zone b's sidecar writes to its own zone only.
	cfgB := zonedConfig("b", entries...)
	cfgB.Codec, cfgB.Keys, cfgB.ZoneWrites = codecConfig(), keysConfig(), zones.WritesLocal
	_, addrB := startProxy(t, cfgB)
	a, b := newLineClient(t, addrA), newLineClient(t, addrB)
	da, db := newLineClient(t, za[0]), newLineClient(t, zb[0])

	key := tierKey("zoned")
	value := tierValue(5, 3000)
	if r := b.do(fmt.Sprintf("set %s 3 0 %d\r\n%s\r\n", key, len(value), value)); r != "STORED\r\n" {
		t.Fatalf("set through zone b: %q", r)
	}
	if _, _, ok := inZone(t, za, key); ok {
		t.Fatal("the key is in zone a before any read")
	}
	hitsA, hitsB := da.stat("get_hits"), db.stat("get_hits")
	if r := a.do("get " + key + "\r\n"); r != valueReply(key, 3, value) {
		t.Fatalf("first get through zone a: %q", short(r))
	}
	if da.stat("get_hits") != hitsA || db.stat("get_hits") != hitsB+1 {
		t.Fatalf("first get: zone a hits +%d, zone b +%d; want 0 and 1", da.stat("get_hits")-hitsA, db.stat("get_hits")-hitsB)
	}
	if !waitFor(2*time.Second, func() bool { _, _, ok := inZone(t, za, key); return ok }) {
		t.Fatal("the key was not filled into zone a")
	}
	hitsA = da.stat("get_hits") // inZone's own reads are hits of zone a
	const rounds = 5
	for range rounds {
		if r := a.do("get " + key + "\r\n"); r != valueReply(key, 3, value) {
			t.Fatalf("get through zone a: %q", short(r))
		}
	}
	if da.stat("get_hits") != hitsA || db.stat("get_hits") != hitsB+1 {
		t.Errorf("tier hits went upstream: zone a hits +%d, zone b +%d", da.stat("get_hits")-hitsA, db.stat("get_hits")-hitsB-1)
	}
	if h := tierHits(t, reg); h != rounds {
		t.Errorf("tier hits %v, want %d", h, rounds)
	}
	// A delete through zone a's sidecar reaches both zones and the tier.
	if r := a.do("delete " + key + "\r\n"); r != "DELETED\r\n" {
		t.Fatalf("delete: %q", r)
	}
	if r := a.do("get " + key + "\r\n"); r != "END\r\n" {
		t.Errorf("get after delete: %q", short(r))
	}
}

// BenchmarkHundredKeyGetPostings measures a 100-key get of postings-sized
// values (8 to 16 KiB under Mimir P2: keys) through the sidecar, on one
// connection, with the tier off and with the tier warm. It reports the
// median and 99th percentile latency of a request.
func BenchmarkHundredKeyGetPostings(b *testing.B) {
	up := startMemcached(b)
	var keys []string
	var values []string
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 100 {
		keys = append(keys, tierKey("bench-"+strconv.Itoa(i)))
		values = append(values, tierValue(uint64(i), 8<<10+rng.IntN(8<<10+1)))
	}
	req := []byte("get " + strings.Join(keys, " ") + "\r\n")
	var want bytes.Buffer
	for i, k := range keys {
		fmt.Fprintf(&want, "VALUE %s 0 %d\r\n%s\r\n", k, len(values[i]), values[i])
	}
	want.WriteString("END\r\n")

	for _, tc := range []struct {
		name string
		size ByteSize
	}{{"tier=off", 0}, {"tier=warm", tierTestSize}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := tierConfig(tc.size, up)
			if tc.size == 0 {
				cfg = keyspaceConfig(up)
			}
			p, addr := startProxy(b, cfg)
			lc := newLineClient(b, addr)
			for i, k := range keys {
				if r := lc.do(fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", k, len(values[i]), values[i])); r != "STORED\r\n" {
					b.Fatalf("set: %q", r)
				}
			}
			// Warm the tier, and check the reply once.
			if r := lc.do(string(req)); r != want.String() {
				b.Fatalf("get: %q", short(r))
			}
			if p.tier != nil {
				if st := p.tier.Stats(); st.Entries != len(keys) {
					b.Fatalf("the tier holds %d entries after warming, want %d", st.Entries, len(keys))
				}
			}
			rc := newRawClient(b, addr)
			took := make([]time.Duration, 0, b.N)
			b.ReportAllocs() // the sidecar's, mostly: it runs in this process
			b.ResetTimer()
			for range b.N {
				began := time.Now()
				if n, err := readHundred(rc, req); err != nil || n != len(keys) {
					b.Fatalf("%d values: %v", n, err)
				}
				took = append(took, time.Since(began))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// readHundred sends req and reads the VALUE blocks of its reply up to END,
// without allocating, and returns how many there were.
func readHundred(rc *rawClient, req []byte) (int, error) {
	if _, err := rc.rw.Write(req); err != nil {
		return 0, err
	}
	if err := rc.rw.Flush(); err != nil {
		return 0, err
	}
	for n := 0; ; n++ {
		line, err := rc.rw.ReadSlice('\n')
		if err != nil {
			return n, err
		}
		if string(line) == "END\r\n" {
			return n, nil
		}
		line = bytes.TrimSuffix(line, []byte("\r\n"))
		size, err := strconv.Atoi(string(line[bytes.LastIndexByte(line, ' ')+1:]))
		if !bytes.HasPrefix(line, []byte("VALUE ")) || err != nil {
			return n, fmt.Errorf("unexpected reply %q", line)
		}
		if _, err := rc.rw.Discard(size + 2); err != nil {
			return n, err
		}
	}
}

// TestLocalTierCountsEveryKeyNamed names an immutable key three times in
// one get, once it is in the tier and once it is in neither the tier nor
// memcached: the tier's reads count each naming, as memcached's get_hits
// and get_misses do, on one event loop and on two.
func TestLocalTierCountsEveryKeyNamed(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprint("event-loops=", loops), func(t *testing.T) {
			cfg := tierConfig(tierTestSize, startMemcached(t))
			cfg.EventLoops = loops
			p, addr := startProxy(t, cfg)
			reg := registry(t, p)
			sc := newLineClient(t, addr)
			misses := func() float64 {
				return counterWith(t, reg, "mcsidecar_local_cache_reads_total", "result", "miss")
			}
			key, absent := tierKey("thrice"), tierKey("absent")
			if r := sc.do(setReq("set", key, "v")); r != "STORED\r\n" {
				t.Fatalf("set: %q", r)
			}
			sc.do("get " + key + "\r\n") // fills the tier
			hits0, misses0 := tierHits(t, reg), misses()
			want := strings.Repeat(strings.TrimSuffix(valueReply(key, 0, "v"), "END\r\n"), 3) + "END\r\n"
			if r := sc.do("get " + key + " " + key + " " + key + "\r\n"); r != want {
				t.Fatalf("get of a key named thrice: %q", r)
			}
			if h := tierHits(t, reg) - hits0; h != 3 {
				t.Errorf("tier hits rose by %v for a key named thrice, want 3", h)
			}
			if r := sc.do("get " + absent + " " + absent + "\r\n"); r != "END\r\n" {
				t.Fatalf("get of an absent key named twice: %q", r)
			}
			if m := misses() - misses0; m != 2 {
				t.Errorf("tier misses rose by %v for an absent key named twice, want 2", m)
			}
		})
	}
}
