package proxy

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/zones"
)

// TestEventLoopServesZones checks that zones stay on the loop: a gets
// falls through the zones in order, answering each key with the flags and
// CAS of the first zone that has it, a duplicate key included; the hits
// of other zones are filled into the local one with their time to live;
// reads are counted per zone; set, touch and delete reach every zone.
func TestEventLoopServesZones(t *testing.T) {
	a, b, c := startZone(t, 2), startZone(t, 2), startZone(t, 2)
	cfg := zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b), zoneEntry("c", c))
	cfg.EventLoops = 1
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	sidecar := newLineClient(t, addr)

	type item struct {
		key   string
		zone  []string
		flags uint32
		ttl   int
		data  string
	}
	items := []item{
		{"in-c", c, 42, 1000, "from zone c"},
		{"in-b", b, 7, 0, "from zone b"},
		{"in-a", a, 1, 0, "from zone a"},
	}
	want := ""
	for _, it := range items {
		owner := ownerOf(t, it.zone, it.key)
		directSet(t, owner, it.key, it.flags, it.ttl, it.data)
		cas := strings.Fields(directDo(t, owner, "gets "+it.key+"\r\n"))[4]
		want += fmt.Sprintf("VALUE %s %d %d %s\r\n%s\r\n", it.key, it.flags, len(it.data), cas, it.data)
	}
	// The first key again, at the end, and a key no zone holds.
	want += want[:strings.Index(want, "VALUE in-b")] + "END\r\n"
	if got := sidecar.do("gets in-c in-b in-a nowhere in-c\r\n"); got != want {
		t.Fatalf("gets through zone a's sidecar:\n got %q\nwant %q", got, want)
	}
	if got := sidecar.do("get in-b\r\n"); got != valueReply("in-b", 7, "from zone b") {
		t.Errorf("get after the fill: %q", got)
	}

	for _, w := range []struct {
		key    string
		lo, hi int
	}{{"in-c", 900, 1000}, {"in-b", -1, -1}} {
		own := ownerOf(t, a, w.key)
		var ttl int
		if !waitFor(2*time.Second, func() bool {
			var ok bool
			ttl, ok = ttlIn(t, own, w.key)
			return ok
		}) {
			t.Fatalf("%s was not filled into zone a", w.key)
		}
		if ttl < w.lo || ttl > w.hi {
			t.Errorf("%s filled with a TTL of %d, want %d to %d", w.key, ttl, w.lo, w.hi)
		}
	}
	if !waitFor(2*time.Second, func() bool { return counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored") == 2 }) {
		t.Errorf("fills stored: %v, want 2", counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored"))
	}
	for _, w := range []struct {
		zone, local, result string
		want                float64
	}{
		// gets: a has in-a; b is asked for in-c, in-b and nowhere; c
		// for in-c and nowhere. Then the get of in-b hits in a.
		{"a", "true", "hit", 2}, {"a", "true", "miss", 3},
		{"b", "false", "hit", 1}, {"b", "false", "miss", 2},
		{"c", "false", "hit", 1}, {"c", "false", "miss", 1},
		{"a", "true", "error", 0}, {"b", "false", "error", 0}, {"c", "false", "error", 0},
	} {
		if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", w.zone, "local", w.local, "result", w.result); got != w.want {
			t.Errorf("zone reads {zone=%s,result=%s}: %v, want %v", w.zone, w.result, got, w.want)
		}
	}

	// Writes of every zone.
	if got := sidecar.do(setReq("set", "everywhere", "v1")); got != "STORED\r\n" {
		t.Fatalf("set: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if _, d, ok := inZone(t, z, "everywhere"); !ok || d != "v1" {
			t.Errorf("zone %v after the set: %q, %v", z, d, ok)
		}
	}
	if got := sidecar.do("touch everywhere 600\r\n"); got != "TOUCHED\r\n" {
		t.Fatalf("touch: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if ttl, ok := ttlIn(t, ownerOf(t, z, "everywhere"), "everywhere"); !ok || ttl < 500 || ttl > 600 {
			t.Errorf("zone %v after the touch: TTL %d, %v", z, ttl, ok)
		}
	}
	if got := sidecar.do("delete everywhere\r\n"); got != "DELETED\r\n" {
		t.Fatalf("delete: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if _, _, ok := inZone(t, z, "everywhere"); ok {
			t.Errorf("zone %v still has the key after the delete", z)
		}
	}
	if got := sidecar.do("delete everywhere\r\n"); got != "NOT_FOUND\r\n" {
		t.Errorf("second delete: %q", got)
	}
}

// TestEventLoopZonesKeepEnvelopes reads, through zone a's sidecar on a
// loop, a rewritten key and a postings key that only zone c holds: both
// are opened and answered, and filled into zone a as the envelopes zone c
// holds, from which the next read answers the same.
func TestEventLoopZonesKeepEnvelopes(t *testing.T) {
	a, c := startMemcached(t), startMemcached(t)
	zoned := func(local, writes string) Config {
		cfg := zonedConfig(local, zoneEntry("a", []string{a}), zoneEntry("c", []string{c}))
		cfg.Keys, cfg.Codec, cfg.ZoneWrites, cfg.EventLoops = keysConfig(), codecConfig(), writes, 1
		return cfg
	}
	_, addrC := startProxy(t, zoned("c", zones.WritesLocal))
	p, addrA := startProxy(t, zoned("a", zones.WritesAll))
	long := mimirLV2Key()
	ks, err := keyspace.New(*keysConfig())
	if err != nil {
		t.Fatal(err)
	}
	upKey, _, _ := ks.AppendRewrite(nil, []byte(long))
	value := strings.Repeat("postings 1234567 ", 20)
	inC := newLineClient(t, addrC)
	for _, k := range []string{long, "P2:zoned"} {
		if got := inC.do(setReq("set", k, value)); got != "STORED\r\n" {
			t.Fatalf("set %s in zone c: %q", short(k), got)
		}
	}
	if _, _, ok := inZone(t, []string{a}, "P2:zoned"); ok {
		t.Fatal("a write of zone c's sidecar reached zone a")
	}
	want := valueReply(long, 0, value)
	want = want[:len(want)-len("END\r\n")] + valueReply("P2:zoned", 0, value)
	sidecar := newLineClient(t, addrA)
	if got := sidecar.do("get " + long + " P2:zoned\r\n"); got != want {
		t.Fatalf("get through zone a's sidecar: %q", short(got))
	}
	for _, k := range []string{string(upKey), "P2:zoned"} {
		var fa, fc uint32
		var da, dc string
		if !waitFor(2*time.Second, func() bool {
			var ok bool
			fa, da, ok = inZone(t, []string{a}, k)
			return ok
		}) {
			t.Fatalf("%s was not filled into zone a", short(k))
		}
		fc, dc, _ = inZone(t, []string{c}, k)
		if fa != fc || da != dc || fa&(1<<codec.DefaultFlagBit) == 0 {
			t.Errorf("%s filled as flags %d, %d bytes; zone c holds flags %d, %d bytes", short(k), fa, len(da), fc, len(dc))
		}
	}
	if got := sidecar.do("get " + long + " P2:zoned\r\n"); got != want {
		t.Fatalf("get from zone a after the fill: %q", short(got))
	}
	reg := registry(t, p)
	if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", "a", "local", "true", "result", "hit"); got != 2 {
		t.Errorf("zone a hits: %v, want 2 (the second get)", got)
	}
}

// TestEventLoopServesFromTheLocalTier checks the local tier on the loop:
// an immutable key's hits after the first cost memcached nothing, gets
// still goes upstream for its CAS, every write through the loop drops
// the entry at once, and nothing leaves the loop.
func TestEventLoopServesFromTheLocalTier(t *testing.T) {
	up := startMemcached(t)
	cfg := tierConfig(tierTestSize, up)
	cfg.EventLoops = 1
	_, addr := startProxy(t, cfg)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)
	key, long := tierKey("loop"), mimirLV2Key()
	reached := func(req, want string) int {
		t.Helper()
		before := direct.stat("get_hits") + direct.stat("get_misses")
		if got := sc.do(req); got != want {
			t.Fatalf("%q answered %q, want %q", short(req), short(got), short(want))
		}
		return int(direct.stat("get_hits") + direct.stat("get_misses") - before)
	}
	for i, v := range []string{"first", "second"} {
		if got := sc.do(setReq("set", key, v)); got != "STORED\r\n" {
			t.Fatalf("set %d: %q", i, got)
		}
		if got := sc.do(setReq("set", long, v+" long")); got != "STORED\r\n" {
			t.Fatalf("set %d of the long key: %q", i, got)
		}
		both := valueReply(key, 0, v)
		both = both[:len(both)-len("END\r\n")] + valueReply(long, 0, v+" long")
		if n := reached("get "+key+" "+long+"\r\n", both); n != 2 {
			t.Errorf("first get after set %d reached memcached for %d keys, want 2", i, n)
		}
		for range 3 {
			if n := reached("get "+key+" "+long+"\r\n", both); n != 0 {
				t.Errorf("a get of kept keys reached memcached for %d keys", n)
			}
		}
		if got := sc.do("gets " + key + "\r\n"); !strings.HasPrefix(got, "VALUE "+key+" 0 "+strconv.Itoa(len(v))+" ") {
			t.Errorf("gets: %q", got)
		}
	}
	if got := sc.do("delete " + key + "\r\n"); got != "DELETED\r\n" {
		t.Fatalf("delete: %q", got)
	}
	if n := reached("get "+key+"\r\n", "END\r\n"); n != 1 {
		t.Errorf("get after the delete reached memcached for %d keys, want 1", n)
	}
}

// TestEventLoopZoneWrites runs every command of one key, with
// --zone-writes=all and with --zone-writes=local, through a sidecar over
// two zones whose keys start in zone b (and one in both), and checks each
// reply and what each zone holds after.
func TestEventLoopZoneWrites(t *testing.T) {
	for _, writes := range []string{zones.WritesAll, zones.WritesLocal} {
		t.Run(writes, func(t *testing.T) { testEventLoopZoneWrites(t, writes) })
	}
}

func testEventLoopZoneWrites(t *testing.T, writes string) {
	keys := []string{"only-b", "only-b-add", "only-b-replace", "num-b", "only-b-append", "only-b-touch", "in-both", "cas-b", "nowhere", "new-key"}
	a, b := startMemcached(t), startMemcached(t)
	cfg := zonedConfig("a", zoneEntry("a", []string{a}), zoneEntry("b", []string{b}))
	cfg.ZoneWrites, cfg.EventLoops = writes, 1
	p, addr := startProxy(t, cfg)
	for _, k := range keys[:len(keys)-2] {
		v := "b's " + k
		if k == "num-b" {
			v = "10"
		}
		directSet(t, b, k, 3, 0, v)
	}
	directSet(t, a, "in-both", 4, 0, "a's in-both")
	casB := strings.Fields(directDo(t, b, "gets cas-b\r\n"))[4]
	c := newLineClient(t, addr)
	// Each request with its reply under --zone-writes=all and under
	// --zone-writes=local.
	for _, step := range []struct{ req, all, local string }{
		{setReq("set", "new-key", "fresh"), "STORED\r\n", "STORED\r\n"},
		{"delete only-b\r\n", "NOT_FOUND\r\n", "DELETED\r\n"},
		{"delete nowhere\r\n", "NOT_FOUND\r\n", "NOT_FOUND\r\n"},
		{setReq("add", "only-b-add", "added"), "NOT_STORED\r\n", "STORED\r\n"},
		{setReq("replace", "only-b-replace", "replaced"), "STORED\r\n", "STORED\r\n"},
		{setReq("replace", "nowhere", "x"), "NOT_STORED\r\n", "NOT_STORED\r\n"},
		{"incr num-b 5\r\n", "15\r\n", "15\r\n"},
		{"decr nowhere 1\r\n", "NOT_FOUND\r\n", "NOT_FOUND\r\n"},
		{setReq("append", "only-b-append", "+tail"), "STORED\r\n", "STORED\r\n"},
		{setReq("prepend", "nowhere", "head+"), "NOT_STORED\r\n", "NOT_STORED\r\n"},
		{"touch only-b-touch 100\r\n", "NOT_FOUND\r\n", "TOUCHED\r\n"},
		{"touch nowhere 100\r\n", "NOT_FOUND\r\n", "NOT_FOUND\r\n"},
		{"cas in-both 0 0 1 1\r\nx\r\n", "STORED\r\n", "STORED\r\n"},
		{"cas cas-b 9 0 3 " + casB + "\r\nnew\r\n", "STORED\r\n", "STORED\r\n"},
		{setReq("set", "in-both", "both again"), "STORED\r\n", "STORED\r\n"},
		{setReq("add", "in-both", "not stored"), "NOT_STORED\r\n", "NOT_STORED\r\n"},
		{setReq("add", "nowhere", "added everywhere"), "STORED\r\n", "STORED\r\n"},
	} {
		want := step.all
		if writes == zones.WritesLocal {
			want = step.local
		}
		if got := c.do(step.req); got != want {
			t.Errorf("%q answered %q, want %q", short(step.req), got, want)
		}
	}
	// What each zone holds after: "zone key" to flags and data.
	want := map[string]string{
		"a in-both":        `0 "both again"`,
		"a new-key":        `0 "fresh"`,
		"a nowhere":        `0 "added everywhere"`,
		"b cas-b":          `9 "new"`,
		"b num-b":          `3 "15"`,
		"b only-b-add":     `3 "b's only-b-add"`,
		"b only-b-append":  `3 "b's only-b-append+tail"`,
		"b only-b-replace": `0 "replaced"`,
		"b only-b-touch":   `3 "b's only-b-touch"`,
	}
	if writes == zones.WritesAll {
		maps.Copy(want, map[string]string{
			"a cas-b":          `9 "new"`,
			"a only-b-replace": `0 "replaced"`,
			"b in-both":        `0 "both again"`,
			"b new-key":        `0 "fresh"`,
			"b nowhere":        `0 "added everywhere"`,
		})
	} else {
		maps.Copy(want, map[string]string{
			"a only-b-add": `0 "added"`,
			"b in-both":    `3 "b's in-both"`,
		})
	}
	held := map[string]string{}
	for _, k := range keys {
		for zone, srv := range map[string]string{"a": a, "b": b} {
			if f, d, ok := inZone(t, []string{srv}, k); ok {
				held[zone+" "+k] = fmt.Sprintf("%d %q", f, d)
			}
		}
	}
	if !maps.Equal(held, want) {
		t.Errorf("the zones hold after the writes:\n%v\nwant:\n%v", held, want)
	}
	// The deletes that bring zones in line are not damaged items.
	if n := p.stats.CodecDeleted.Load(); n != 0 {
		t.Errorf("%d deletes counted as of damaged items", n)
	}
}

// TestZonesReadAfterATouchOfTheOtherZones: a gat, gats or mg with T that
// finds a key touches its copies in the other zones once its own reads
// are in. A read the client pipelined after it must not reach those zones
// first and find a copy the touch would have expired. The first script is
// what FuzzDifferential found (a miss in the local zone among the gat's
// keys sends it on to the next zone); the replies must be memcached's.
func TestZonesReadAfterATouchOfTheOtherZones(t *testing.T) {
	upZ := []string{startMemcached(t), startMemcached(t)}
	direct := startMemcached(t)
	cfg := zonedConfig("a", zoneEntry("a", upZ[:1]), zoneEntry("b", upZ[1:]))
	cfg.EventLoops = 1
	_, via := startProxy(t, cfg)
	long := "k3" + strings.Repeat("x", 240)
	for _, script := range []string{
		"get k0\r\nset k0 147 0 33\r\nipwdkryfmtahovcjqxelszgnubipwdkry\r\ngat -1 k1 k2 " + long + " k2 k2 k0\r\n" +
			"gets k0 k0 k1 " + long + " " + long + " k1\r\nmn\r\n",
		"set k0 1 0 1\r\nx\r\ngats -1 k1 " + long + " k0\r\nget k0\r\nmg k0 v\r\nmn\r\n",
		"set k0 1 0 1\r\nx\r\nmg k1 v\r\nmg k0 T-1 v\r\nmg k0 v\r\nget k0\r\nmn\r\n",
	} {
		for range 5 {
			for _, addr := range append([]string{direct}, upZ...) {
				if r, err := converse(addr, []byte("flush_all\r\n"), 5*time.Second); err != nil || string(r.head) != "OK\r\n" {
					t.Fatalf("flush_all of %s: %q, %v", addr, r.head, err)
				}
			}
			want := casByOrder(exchange(t, direct, script))
			if got := casByOrder(exchange(t, via, script)); got != want {
				t.Fatalf("script %q\nproxy     %q\nmemcached %q", script, got, want)
			}
		}
	}
}
