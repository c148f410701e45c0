package proxy

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"

	"github.com/prometheus/client_golang/prometheus"
)

// startZone starts n memcached servers for one zone and returns their
// addresses.
func startZone(t *testing.T, n int) []string {
	t.Helper()
	var servers []string
	for range n {
		servers = append(servers, startMemcached(t))
	}
	return servers
}

// zoneEntry is the --upstream-zone value for a zone of servers.
func zoneEntry(name string, servers []string) string {
	return name + "=" + strings.Join(servers, ",")
}

// zonedConfig is the test configuration of a sidecar in zone local, over
// the zones given as --upstream-zone values, writing to every zone and
// filling the local one.
func zonedConfig(local string, entries ...string) Config {
	cfg := testConfig()
	cfg.Upstreams = nil
	cfg.Zone = local
	cfg.ZoneUpstreams = entries
	cfg.ZoneWrites = zones.WritesAll
	cfg.ZoneFill = true
	return cfg
}

// ownerOf returns the server of a zone that owns key, as the proxy picks
// it: jump hash over the servers in their natural order.
func ownerOf(t *testing.T, servers []string, key string) string {
	t.Helper()
	ss, err := upstream.NewServerSelector(upstream.SelectJump, servers)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := ss.PickServer(key)
	if err != nil {
		t.Fatal(err)
	}
	// Each lists the servers in the order they are picked by.
	ordered, i := upstream.OrderServers(servers), 0
	var name string
	ss.Each(func(a net.Addr) error {
		if a == owner {
			name = ordered[i]
		}
		i++
		return nil
	})
	return name
}

// directDo sends req straight to the memcached at addr and returns its
// one reply.
func directDo(t *testing.T, addr, req string) string {
	t.Helper()
	lc := newLineClient(t, addr)
	defer lc.c.Close()
	return lc.do(req)
}

// directSet stores data under key straight in the memcached at addr.
func directSet(t *testing.T, addr, key string, flags uint32, exptime int, data string) {
	t.Helper()
	req := fmt.Sprintf("set %s %d %d %d\r\n%s\r\n", key, flags, exptime, len(data), data)
	if r := directDo(t, addr, req); r != "STORED\r\n" {
		t.Fatalf("direct set %s on %s: %q", key, addr, r)
	}
}

// inZone asks every server of a zone directly for key and returns the
// item of the first that holds it, and whether one does.
func inZone(t *testing.T, servers []string, key string) (flags uint32, data string, ok bool) {
	t.Helper()
	for _, s := range servers {
		lc := newLineClient(t, s)
		flags, data, ok = rawItem(t, lc, key)
		lc.c.Close()
		if ok {
			return flags, data, true
		}
	}
	return 0, "", false
}

// ttlIn returns the remaining time to live of key on the memcached at
// addr (mg's t flag: -1 for none), and whether it holds the key.
func ttlIn(t *testing.T, addr, key string) (int, bool) {
	t.Helper()
	reply := directDo(t, addr, "mg "+key+" t\r\n")
	if reply == "EN\r\n" {
		return 0, false
	}
	ttl, ok := strings.CutPrefix(strings.TrimSuffix(reply, "\r\n"), "HD t")
	n, err := strconv.Atoi(ttl)
	if !ok || err != nil {
		t.Fatalf("mg %s t on %s: %q", key, addr, reply)
	}
	return n, true
}

// valueReply is the reply to "get key" of a hit.
func valueReply(key string, flags uint32, data string) string {
	return fmt.Sprintf("VALUE %s %d %d\r\n%s\r\nEND\r\n", key, flags, len(data), data)
}

// setReq is a set of key to data with no expiry.
func setReq(verb, key, data string) string {
	return fmt.Sprintf("%s %s 0 0 %d\r\n%s\r\n", verb, key, len(data), data)
}

// bytesWritten returns memcached's bytes_written through lc, and the size
// of the stats reply that reported it, which memcached counts once sent.
func bytesWritten(t *testing.T, lc *lineClient) (n uint64, reply uint64) {
	t.Helper()
	r := lc.do("stats\r\n")
	for _, line := range strings.Split(r, "\r\n") {
		if v, ok := strings.CutPrefix(line, "STAT bytes_written "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("bytes_written %q", v)
			}
			return n, uint64(len(r))
		}
	}
	t.Fatalf("stats has no bytes_written:\n%s", r)
	return 0, 0
}

// sentDuring runs fn and returns, for each server, the bytes it sent
// meanwhile, by its own bytes_written less the stats reply taken before.
func sentDuring(t *testing.T, servers []string, fn func()) []uint64 {
	t.Helper()
	clients := make([]*lineClient, len(servers))
	before := make([]uint64, len(servers))
	for i, s := range servers {
		clients[i] = newLineClient(t, s)
		n, reply := bytesWritten(t, clients[i])
		before[i] = n + reply
	}
	fn()
	sent := make([]uint64, len(servers))
	for i, lc := range clients {
		n, _ := bytesWritten(t, lc)
		sent[i] = n - before[i]
		lc.c.Close()
	}
	return sent
}

// counterWith returns the counter or gauge name whose labels are exactly
// labels, given as name, value pairs; the series must exist.
func counterWith(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, ok := metricValue(t, reg, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// zoneWorkload is keys with values of 1 to 4 KiB, the same on every run.
func zoneWorkload(n int) (keys, values []string) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range n {
		b := make([]byte, 1024+rng.IntN(3*1024+1))
		for j := range b {
			b[j] = 'a' + byte(rng.IntN(26))
		}
		keys = append(keys, "zone-key-"+strconv.Itoa(i))
		values = append(values, string(b))
	}
	return keys, values
}

// crossZoneShare writes the workload through sidecars[0], then reads
// every key through each sidecar in turn; sidecar x is in zone x, and so
// is server i when zoneOf[i] == x. It returns the share of the bytes the
// servers sent during the reads that crossed a zone.
func crossZoneShare(t *testing.T, sidecars, servers []string, zoneOf []int, keys, values []string) float64 {
	t.Helper()
	writer := newLineClient(t, sidecars[0])
	var valueBytes uint64
	for i, k := range keys {
		if r := writer.do(setReq("set", k, values[i])); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
		valueBytes += uint64(len(values[i]))
	}
	var cross, total uint64
	for x, sidecar := range sidecars {
		reader := newLineClient(t, sidecar)
		sent := sentDuring(t, servers, func() {
			for i, k := range keys {
				if r := reader.do("get " + k + "\r\n"); r != valueReply(k, 0, values[i]) {
					t.Fatalf("sidecar %d: get %s: %q", x, k, short(r))
				}
			}
		})
		var phase uint64
		for i, n := range sent {
			phase += n
			if zoneOf[i] != x {
				cross += n
			}
		}
		// The servers sent every value once, and a few dozen bytes of
		// framing a key: the values dominate what is measured.
		if phase < valueBytes || phase > valueBytes+100*uint64(len(keys)) {
			t.Fatalf("sidecar %d: servers sent %d bytes for %d bytes of values", x, phase, valueBytes)
		}
		total += phase
	}
	return float64(cross) / float64(total)
}

// TestZonesKeepReadsInTheirZone reads the same keys through a sidecar in
// each of three zones, and measures from memcached's own counters how
// many of the bytes read crossed a zone: with zones almost none, with one
// cluster shared by all zones about two thirds.
func TestZonesKeepReadsInTheirZone(t *testing.T) {
	keys, values := zoneWorkload(300)
	names := []string{"a", "b", "c"}
	zoneOf := []int{0, 0, 1, 1, 2, 2}

	var servers, entries []string
	for _, name := range names {
		zone := startZone(t, 2)
		servers = append(servers, zone...)
		entries = append(entries, zoneEntry(name, zone))
	}
	var sidecars []string
	for _, name := range names {
		_, addr := startProxy(t, zonedConfig(name, entries...))
		sidecars = append(sidecars, addr)
	}
	zoned := crossZoneShare(t, sidecars, servers, zoneOf, keys, values)

	shared := startZone(t, 6)
	var sharedSidecars []string
	for range names {
		_, addr := startProxy(t, testConfig(shared...))
		sharedSidecars = append(sharedSidecars, addr)
	}
	one := crossZoneShare(t, sharedSidecars, shared, zoneOf, keys, values)

	t.Logf("cross-zone share of bytes read: zones %.1f%%, one shared cluster %.1f%%", 100*zoned, 100*one)
	if zoned > 0.05 {
		t.Errorf("with zones %.1f%% of the bytes read crossed a zone, want at most 5%%", 100*zoned)
	}
	if one <= 0.5 {
		t.Errorf("with one shared cluster %.1f%% of the bytes read crossed a zone, want over 50%%", 100*one)
	}
}

// TestZoneMissIsFoundInAnotherZoneAndFilled reads through zone a's sidecar
// keys that only zone c holds: the hit answers with zone c's flags and
// CAS, and is stored into zone a with its remaining time to live (a gat's
// new exptime), and into no other zone.
func TestZoneMissIsFoundInAnotherZoneAndFilled(t *testing.T) {
	a, b, c := startZone(t, 2), startZone(t, 2), startZone(t, 2)
	p, addr := startProxy(t, zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b), zoneEntry("c", c)))
	reg := registry(t, p)
	sidecar := newLineClient(t, addr)

	// filled waits for key to be in zone a, on its own server only, with a
	// time to live in [lo, hi], and checks its value.
	filled := func(key string, flags uint32, data string, lo, hi int) {
		t.Helper()
		own := ownerOf(t, a, key)
		var ttl int
		if !waitFor(2*time.Second, func() bool {
			var ok bool
			ttl, ok = ttlIn(t, own, key)
			return ok
		}) {
			t.Fatalf("%s was not filled into zone a", key)
		}
		if ttl < lo || ttl > hi {
			t.Errorf("%s filled into zone a with a TTL of %d, want %d to %d", key, ttl, lo, hi)
		}
		for _, s := range a {
			if s == own {
				continue
			}
			if _, ok := ttlIn(t, s, key); ok {
				t.Errorf("%s is in zone a also on %s, which does not own it", key, s)
			}
		}
		lc := newLineClient(t, own)
		if f, d, ok := rawItem(t, lc, key); !ok || f != flags || d != data {
			t.Errorf("%s filled into zone a as flags %d %q, want %d %q", key, f, d, flags, data)
		}
		if _, _, ok := inZone(t, b, key); ok {
			t.Errorf("%s was filled into zone b, which is not the sidecar's", key)
		}
	}

	const key, data = "only-in-c", "hello from zone c"
	owner := ownerOf(t, c, key)
	directSet(t, owner, key, 42, 1000, data)
	cas := strings.Fields(directDo(t, owner, "gets "+key+"\r\n"))[4]
	if r := sidecar.do("gets " + key + "\r\n"); r != fmt.Sprintf("VALUE %s 42 %d %s\r\n%s\r\nEND\r\n", key, len(data), cas, data) {
		t.Fatalf("gets through zone a's sidecar: %q, want zone c's item with CAS %s", r, cas)
	}
	filled(key, 42, data, 900, 1000)
	if !waitFor(2*time.Second, func() bool { return counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored") == 1 }) {
		t.Errorf("fills stored: %v, want 1", counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored"))
	}
	// The next read is a hit in zone a, asked of no other zone.
	if r := sidecar.do("get " + key + "\r\n"); r != valueReply(key, 42, data) {
		t.Fatalf("second get: %q", r)
	}
	reads := func(zone, local, result string) float64 {
		return counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", zone, "local", local, "result", result)
	}
	for _, w := range []struct {
		zone, local, result string
		want                float64
	}{
		{"a", "true", "miss", 1}, {"a", "true", "hit", 1}, {"a", "true", "error", 0},
		{"b", "false", "miss", 1}, {"b", "false", "hit", 0},
		{"c", "false", "hit", 1}, {"c", "false", "miss", 0},
	} {
		if got := reads(w.zone, w.local, w.result); got != w.want {
			t.Errorf("zone reads {zone=%s,local=%s,result=%s}: %v, want %v", w.zone, w.local, w.result, got, w.want)
		}
	}
	if got := counterWith(t, reg, "mcsidecar_zone_read_bytes_total", "zone", "c", "local", "false"); got != float64(len(data)) {
		t.Errorf("bytes read from zone c: %v, want %d", got, len(data))
	}
	if got := counterWith(t, reg, "mcsidecar_zone_read_bytes_total", "zone", "a", "local", "true"); got != float64(len(data)) {
		t.Errorf("bytes read from zone a: %v, want %d", got, len(data))
	}

	// gat: the fill takes the new exptime.
	const touched = "touched-in-c"
	directSet(t, ownerOf(t, c, touched), touched, 7, 1000, "xyz")
	if r := sidecar.do("gat 500 " + touched + "\r\n"); r != valueReply(touched, 7, "xyz") {
		t.Fatalf("gat through zone a's sidecar: %q", r)
	}
	filled(touched, 7, "xyz", 400, 500)

	// A key no zone holds is a miss, and fills nothing.
	if r := sidecar.do("get nowhere\r\n"); r != "END\r\n" {
		t.Errorf("get of a key no zone holds: %q", r)
	}
	if !waitFor(2*time.Second, func() bool { return counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored") == 2 }) {
		t.Errorf("fills stored: %v, want 2", counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored"))
	}
	for _, result := range []string{"not_stored", "failed"} {
		if got := counterWith(t, reg, "mcsidecar_zone_fills_total", "result", result); got != 0 {
			t.Errorf("fills %s: %v, want 0", result, got)
		}
	}
}

// TestZoneDeleteReachesEveryZone sets a key through one zone's sidecar and
// deletes it through another's: every zone has it, then none does.
func TestZoneDeleteReachesEveryZone(t *testing.T) {
	zones := [][]string{startZone(t, 2), startZone(t, 2), startZone(t, 2)}
	entries := []string{zoneEntry("a", zones[0]), zoneEntry("b", zones[1]), zoneEntry("c", zones[2])}
	_, sidecarA := startProxy(t, zonedConfig("a", entries...))
	_, sidecarB := startProxy(t, zonedConfig("b", entries...))

	const key, data = "everywhere", "in every zone"
	if r := newLineClient(t, sidecarA).do(setReq("set", key, data)); r != "STORED\r\n" {
		t.Fatalf("set through zone a's sidecar: %q", r)
	}
	for z, servers := range zones {
		if _, d, ok := inZone(t, servers, key); !ok || d != data {
			t.Errorf("after the set, zone %d has %q (%v), want %q", z, d, ok, data)
		}
	}
	if r := newLineClient(t, sidecarB).do("delete " + key + "\r\n"); r != "DELETED\r\n" {
		t.Fatalf("delete through zone b's sidecar: %q", r)
	}
	for z, servers := range zones {
		if _, d, ok := inZone(t, servers, key); ok {
			t.Errorf("after the delete, zone %d still has %q", z, d)
		}
	}
	if r := newLineClient(t, sidecarA).do("get " + key + "\r\n"); r != "END\r\n" {
		t.Errorf("get through zone a's sidecar after the delete: %q", r)
	}
}

// TestZoneGatTouchesEveryZone reads keys with gat, and with mg and T,
// through zone a's sidecar: every zone's copy gets the new time to live,
// not only the one that answered, so an exptime that expires at once leaves no zone a copy
// to answer a later read, and a shorter one no copy that outlives it.
func TestZoneGatTouchesEveryZone(t *testing.T) {
	zones := [][]string{startZone(t, 2), startZone(t, 2), startZone(t, 2)}
	entries := []string{zoneEntry("a", zones[0]), zoneEntry("b", zones[1]), zoneEntry("c", zones[2])}
	for _, loops := range []int{1, 2} {
		cfg := zonedConfig("a", entries...)
		cfg.EventLoops = loops
		_, sidecar := startProxy(t, cfg)
		c := newLineClient(t, sidecar)
		gone, short, meta := fmt.Sprintf("gone-%d", loops), fmt.Sprintf("short-%d", loops), fmt.Sprintf("meta-%d", loops)
		for _, key := range []string{gone, short, meta} {
			if r := c.do(setReq("set", key, "v")); r != "STORED\r\n" {
				t.Fatalf("set %s: %q", key, r)
			}
		}
		if r := c.do("gat -1 " + gone + "\r\n"); r != "VALUE "+gone+" 0 1\r\nv\r\nEND\r\n" {
			t.Fatalf("gat -1: %q", r)
		}
		if r := c.do("get " + gone + "\r\n"); r != "END\r\n" {
			t.Errorf("loops=%d: get after gat -1 found %q, want a miss", loops, r)
		}
		if r := c.do("gat 100 " + short + "\r\n"); r != "VALUE "+short+" 0 1\r\nv\r\nEND\r\n" {
			t.Fatalf("gat 100: %q", r)
		}
		if r := c.do("mg " + meta + " T-1 v\r\n"); r != "VA 1\r\nv\r\n" {
			t.Fatalf("mg T-1: %q", r)
		}
		if r := c.do("get " + meta + "\r\n"); r != "END\r\n" {
			t.Errorf("loops=%d: get after mg T-1 found %q, want a miss", loops, r)
		}
		for z, servers := range zones {
			for _, key := range []string{gone, meta} {
				if _, _, ok := inZone(t, servers, key); ok {
					t.Errorf("loops=%d: zone %d still holds %s, which expired", loops, z, key)
				}
			}
			ttl := zoneTTL(t, servers, short)
			if ttl < 90 || ttl > 100 {
				t.Errorf("loops=%d: zone %d holds the key for %d more seconds, want the 100 gat gave it", loops, z, ttl)
			}
		}
	}
}

// TestZoneWritesKeepTheirOrder pipelines an append of a missing key, which
// is tried zone after zone, and a set of the key after it. The set must
// not overtake the append in the zone the append tries second: memcached
// answers NOT_STORED and then STORED, and every zone ends with the set's
// value. Likewise a set after a get that misses in the local zone must
// not reach the next zone before the get.
func TestZoneWritesKeepTheirOrder(t *testing.T) {
	zones := [][]string{startZone(t, 1), startZone(t, 1)}
	entries := []string{zoneEntry("a", zones[0]), zoneEntry("b", zones[1])}
	for _, loops := range []int{1, 2} {
		cfg := zonedConfig("a", entries...)
		cfg.EventLoops = loops
		_, sidecar := startProxy(t, cfg)
		key := fmt.Sprintf("ordered-%d", loops)
		got := exchange(t, sidecar, "append "+key+" 0 0 1\r\nx\r\nset "+key+" 0 0 1\r\nv\r\nget "+key+"\r\n")
		if want := "NOT_STORED\r\nSTORED\r\nVALUE " + key + " 0 1\r\nv\r\nEND\r\n"; got != want {
			t.Errorf("loops=%d: replies %q, want %q", loops, got, want)
		}
		for z, servers := range zones {
			if _, d, ok := inZone(t, servers, key); !ok || d != "v" {
				t.Errorf("loops=%d: zone %d holds %q (%v), want the set's value", loops, z, d, ok)
			}
		}
		// A get that misses in zone a asks zone b next, where the set
		// after it must not have come first.
		key = fmt.Sprintf("read-first-%d", loops)
		got = exchange(t, sidecar, "get "+key+" "+key+"\r\nset "+key+" 0 0 1\r\nv\r\n")
		if want := "END\r\nSTORED\r\n"; got != want {
			t.Errorf("loops=%d: get, then set: replies %q, want %q", loops, got, want)
		}
	}
}

// TestZoneHeldGatGoesAtOnce pipelines, through the loop with zones, a get
// and a gat after it. The gat is held back behind the get (it touches
// other zones, which the get may still read), and must go once the get is
// answered, with the loop's tick an hour away: it must not wait for the
// tick.
func TestZoneHeldGatGoesAtOnce(t *testing.T) {
	tick := loopTick
	loopTick = time.Hour
	t.Cleanup(func() { loopTick = tick }) // after the proxy's own cleanup
	zones := [][]string{startZone(t, 1), startZone(t, 1)}
	cfg := zonedConfig("a", zoneEntry("a", zones[0]), zoneEntry("b", zones[1]))
	cfg.EventLoops = 1
	_, sidecar := startProxy(t, cfg)
	c := newLineClient(t, sidecar)
	if r := c.do(setReq("set", "held", "v")); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	exchangeExact(t, c, "get held\r\ngat 100 held\r\n", "VALUE held 0 1\r\nv\r\nEND\r\nVALUE held 0 1\r\nv\r\nEND\r\n")
}

// TestZoneGatOfKeysInDifferentZones reads with gat, through zone a's
// sidecar, a key only zone b holds and one only zone a holds, and
// with gat -1 a key before one it refuses: the sidecar answers as
// memcached does (the key found in b is filled into a), every zone that
// holds a key gets the new time to live, and the refused request still
// expires the key before it everywhere. An mg with T and a binary key
// reaches the other zone in its wire form.
func TestZoneGatOfKeysInDifferentZones(t *testing.T) {
	zones := [][]string{startZone(t, 1), startZone(t, 1)}
	_, sidecar := startProxy(t, zonedConfig("a", zoneEntry("a", zones[0]), zoneEntry("b", zones[1])))
	direct := func(z int, req, want string) {
		t.Helper()
		if r := newLineClient(t, zones[z][0]).do(req); r != want {
			t.Fatalf("zone %d: %q answered %q, want %q", z, req, r, want)
		}
	}
	direct(0, setReq("set", "only-a", "A"), "STORED\r\n")
	direct(1, setReq("set", "only-b", "B"), "STORED\r\n")
	c := newLineClient(t, sidecar)
	if r := c.do("gat 100 only-b only-a\r\n"); r != "VALUE only-b 0 1\r\nB\r\nVALUE only-a 0 1\r\nA\r\nEND\r\n" {
		t.Fatalf("gat of keys in different zones: %q", r)
	}
	for _, key := range []string{"only-a", "only-b"} {
		for z, servers := range zones {
			if _, _, ok := inZone(t, servers, key); !ok {
				continue // only-a was never in zone b
			}
			if ttl := zoneTTL(t, servers, key); ttl < 90 || ttl > 100 {
				t.Errorf("zone %d holds %s for %d more seconds, want the 100 gat gave it", z, key, ttl)
			}
		}
	}

	if r := c.do(setReq("set", "before", "v")); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	if r := c.do("gat -1 before " + strings.Repeat("k", 251) + "\r\n"); r != "CLIENT_ERROR bad command line format\r\n" {
		t.Fatalf("gat -1 with a refused key: %q", r)
	}
	if r := c.do("get before\r\n"); r != "END\r\n" {
		t.Errorf("get after gat -1 refused a later key: %q, want a miss", r)
	}

	// The key "x 5", then a line of its own: as a touch line's key it
	// would have been a command for zone b.
	bin := base64.StdEncoding.EncodeToString([]byte("x 5\r\nset injected 0 0 1\r\nZ\r\nmn"))
	if r := c.do("ms " + bin + " 1 b\r\nv\r\n"); r != "HD\r\n" {
		t.Fatalf("ms of a binary key: %q", r)
	}
	if r := c.do("mg " + bin + " b T30\r\n"); r != "HD\r\n" {
		t.Fatalf("mg of a binary key with T: %q", r)
	}
	for z, servers := range zones {
		if _, d, ok := inZone(t, servers, "injected"); ok {
			t.Errorf("zone %d holds a key the client never set: %q", z, d)
		}
		if ttl := zoneTTL(t, servers, bin+" b"); ttl < 20 || ttl > 30 {
			t.Errorf("zone %d holds the binary key for %d more seconds, want the 30 mg gave it", z, ttl)
		}
	}
}

// zoneTTL asks the server of a zone that holds key how long it has left
// to live (mg's t flag), or fails the test when none holds it.
func zoneTTL(t *testing.T, servers []string, key string) int {
	t.Helper()
	c := newLineClient(t, ownerOf(t, servers, key))
	r := c.do("mg " + key + " t\r\n")
	var ttl int
	if _, err := fmt.Sscanf(r, "HD t%d\r\n", &ttl); err != nil {
		t.Fatalf("mg %s t: %q", key, r)
	}
	return ttl
}

// TestZoneDownKeepsServing kills both servers of zone a: its sidecar still
// reads every key from the other zones, and still takes writes.
func TestZoneDownKeepsServing(t *testing.T) {
	var a []string
	var kills []func()
	for range 2 {
		addr, kill := startKillableMemcached(t)
		a, kills = append(a, addr), append(kills, kill)
	}
	b, c := startZone(t, 2), startZone(t, 2)
	cfg := zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b), zoneEntry("c", c))
	cfg.Timeout = 100 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.FailureLimit = 3
	cfg.RetryInterval = 200 * time.Millisecond
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	sidecar := newLineClient(t, addr)

	keys, values := zoneWorkload(50)
	for i, k := range keys {
		if r := sidecar.do(setReq("set", k, values[i])); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
	}
	for _, kill := range kills {
		kill()
	}

	start := time.Now()
	for i, k := range keys {
		if r := sidecar.do("get " + k + "\r\n"); r != valueReply(k, 0, values[i]) {
			t.Fatalf("get %s with zone a down: %q", k, short(r))
		}
	}
	if r := sidecar.do(setReq("set", keys[0], "written with zone a down")); r != "STORED\r\n" {
		t.Fatalf("set with zone a down: %q", r)
	}
	if r := sidecar.do("get " + keys[0] + "\r\n"); r != valueReply(keys[0], 0, "written with zone a down") {
		t.Fatalf("get after the set with zone a down: %q", short(r))
	}
	// Nothing waits for a timeout: the dead servers refuse connections,
	// then are ejected.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("serving with zone a down took %v", d)
	}
	for _, z := range [][]string{b, c} {
		if _, d, ok := inZone(t, z, keys[0]); !ok || d != "written with zone a down" {
			t.Errorf("zone %v has %q (%v) after the set", z, d, ok)
		}
	}
	n := float64(len(keys))
	if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", "a", "local", "true", "result", "error"); got != n+1 {
		t.Errorf("zone a read errors: %v, want %v", got, n+1)
	}
	if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", "b", "local", "false", "result", "hit"); got != n+1 {
		t.Errorf("zone b hits: %v, want %v", got, n+1)
	}
	if got := counterWith(t, reg, "mcsidecar_zone_write_failures_total", "zone", "a"); got != 1 {
		t.Errorf("zone a write failures: %v, want 1 (the set)", got)
	}
	if got := counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored"); got != 0 {
		t.Errorf("fills stored into a dead zone: %v", got)
	}
}

// TestZoneSemantics checks how each kind of write keeps two zones in line,
// and that --zone-writes=local keeps writes in the local zone.
func TestZoneSemantics(t *testing.T) {
	a, b := startZone(t, 2), startZone(t, 2)
	entries := []string{zoneEntry("a", a), zoneEntry("b", b)}
	_, addrA := startProxy(t, zonedConfig("a", entries...))
	_, addrB := startProxy(t, zonedConfig("b", entries...))
	sidecarA, sidecarB := newLineClient(t, addrA), newLineClient(t, addrB)
	inBoth := func(what, key, want string) {
		t.Helper()
		for name, z := range map[string][]string{"a": a, "b": b} {
			if _, d, ok := inZone(t, z, key); !ok || d != want {
				t.Errorf("%s: zone %s has %q (%v), want %q", what, name, d, ok, want)
			}
		}
	}

	t.Run("add", func(t *testing.T) {
		if r := sidecarA.do(setReq("add", "added", "first")); r != "STORED\r\n" {
			t.Fatalf("add: %q", r)
		}
		inBoth("add", "added", "first")
		if r := sidecarA.do(setReq("add", "added", "second")); r != "NOT_STORED\r\n" {
			t.Fatalf("second add: %q", r)
		}
		inBoth("refused add", "added", "first")
	})

	t.Run("cas", func(t *testing.T) {
		if r := sidecarA.do(setReq("set", "swapped", "old")); r != "STORED\r\n" {
			t.Fatalf("set: %q", r)
		}
		f := strings.Fields(sidecarA.do("gets swapped\r\n"))
		if len(f) < 5 || f[0] != "VALUE" {
			t.Fatalf("gets: %q", f)
		}
		cas := f[4]
		if r := sidecarA.do(fmt.Sprintf("cas swapped 0 0 3 %s\r\nnew\r\n", cas)); r != "STORED\r\n" {
			t.Fatalf("cas with the CAS from gets: %q", r)
		}
		inBoth("cas", "swapped", "new")
		if r := sidecarA.do(fmt.Sprintf("cas swapped 0 0 5 %s\r\nstale\r\n", cas)); r != "EXISTS\r\n" {
			t.Fatalf("cas with a stale CAS: %q", r)
		}
		inBoth("stale cas", "swapped", "new")
	})

	t.Run("incr", func(t *testing.T) {
		if r := sidecarA.do(setReq("set", "counter", "10")); r != "STORED\r\n" {
			t.Fatalf("set: %q", r)
		}
		inBoth("set", "counter", "10")
		if r := sidecarA.do("incr counter 5\r\n"); r != "15\r\n" {
			t.Fatalf("incr: %q", r)
		}
		if _, d, ok := inZone(t, a, "counter"); !ok || d != "15" {
			t.Errorf("after incr zone a has %q (%v), want 15", d, ok)
		}
		if _, d, ok := inZone(t, b, "counter"); ok {
			t.Errorf("after incr zone b still has %q, want it dropped", d)
		}
		if r := sidecarB.do("get counter\r\n"); r != valueReply("counter", 0, "15") {
			t.Errorf("get through zone b's sidecar after incr: %q, want 15 from zone a", r)
		}
		if !waitFor(2*time.Second, func() bool { _, d, ok := inZone(t, b, "counter"); return ok && d == "15" }) {
			t.Errorf("zone b was not filled with the new count")
		}
	})

	// A zone may lack a copy that another holds: the write is decided
	// by a zone that has it.
	t.Run("incr through a zone without the copy", func(t *testing.T) {
		sidecarA.do(setReq("set", "counted", "10"))
		if r := sidecarA.do("incr counted 5\r\n"); r != "15\r\n" {
			t.Fatalf("incr through a: %q", r)
		}
		// Zone b's copy is gone: its sidecar still counts on.
		if r := sidecarB.do("incr counted 1\r\n"); r != "16\r\n" {
			t.Fatalf("incr through b: %q, want 16", r)
		}
		if r := sidecarA.do("get counted\r\n"); r != valueReply("counted", 0, "16") {
			t.Errorf("get through a: %q, want 16", r)
		}
	})

	t.Run("add through a zone without the copy", func(t *testing.T) {
		sidecarA.do(setReq("set", "joined", "base"))
		if r := sidecarA.do(setReq("append", "joined", "+x")); r != "STORED\r\n" {
			t.Fatalf("append: %q", r)
		}
		if r := sidecarB.do(setReq("add", "joined", "other")); r != "NOT_STORED\r\n" {
			t.Fatalf("add through b of a key zone a holds: %q, want NOT_STORED", r)
		}
		for _, sc := range []*lineClient{sidecarA, sidecarB} {
			if r := sc.do("get joined\r\n"); r != valueReply("joined", 0, "base+x") {
				t.Errorf("get: %q, want base+x", r)
			}
		}
	})

	t.Run("cas with the token of another zone", func(t *testing.T) {
		// Zone b's CAS counter runs ahead of zone a's.
		for i := range 5 {
			directSet(t, ownerOf(t, b, "tokened"), fmt.Sprintf("filler%d", i), 0, 0, "x")
		}
		directSet(t, ownerOf(t, b, "tokened"), "tokened", 3, 0, "v1")
		f := strings.Fields(sidecarA.do("gets tokened\r\n"))
		if len(f) < 5 || f[0] != "VALUE" {
			t.Fatalf("gets: %q", f)
		}
		// The hit was filled into zone a, with a CAS of its own; the
		// client's token is zone b's.
		waitFor(2*time.Second, func() bool { _, _, ok := inZone(t, a, "tokened"); return ok })
		if r := sidecarA.do(fmt.Sprintf("cas tokened 3 0 2 %s\r\nv2\r\n", f[4])); r != "STORED\r\n" {
			t.Fatalf("cas with zone b's token: %q, want STORED", r)
		}
		inBoth("cas", "tokened", "v2")
	})

	// Enveloped items are changed by a read-modify-write, which looks
	// for the item zone after zone the same way.
	t.Run("enveloped incr and append through a zone without the copy", func(t *testing.T) {
		enveloped := func(local string) *lineClient {
			cfg := zonedConfig(local, entries...)
			cfg.Codec = codecConfig()
			cfg.EnvelopeAll = true
			_, addr := startProxy(t, cfg)
			return newLineClient(t, addr)
		}
		ea, eb := enveloped("a"), enveloped("b")
		ea.do(setReq("set", "ecount", "10"))
		if r := ea.do("incr ecount 5\r\n"); r != "15\r\n" {
			t.Fatalf("incr through a: %q", r)
		}
		if _, _, ok := inZone(t, b, "ecount"); ok {
			t.Fatalf("zone b kept its copy after the incr")
		}
		if r := eb.do("incr ecount 1\r\n"); r != "16\r\n" {
			t.Fatalf("incr through b: %q, want 16", r)
		}
		if r := eb.do(setReq("append", "ecount", "!")); r != "STORED\r\n" {
			t.Fatalf("append through b: %q", r)
		}
		if r := ea.do("get ecount\r\n"); r != valueReply("ecount", 0, "16!") {
			t.Errorf("get through a: %q, want 16!", r)
		}
		if r := eb.do("incr nowhere 1\r\n"); r != "NOT_FOUND\r\n" {
			t.Errorf("incr of a key no zone holds: %q", r)
		}
	})

	t.Run("local writes", func(t *testing.T) {
		cfg := zonedConfig("a", entries...)
		cfg.ZoneWrites = zones.WritesLocal
		_, addr := startProxy(t, cfg)
		if r := newLineClient(t, addr).do(setReq("set", "local-only", "here")); r != "STORED\r\n" {
			t.Fatalf("set: %q", r)
		}
		if _, d, ok := inZone(t, a, "local-only"); !ok || d != "here" {
			t.Errorf("zone a has %q (%v), want here", d, ok)
		}
		if _, d, ok := inZone(t, b, "local-only"); ok {
			t.Errorf("zone b has %q, want nothing with --zone-writes=local", d)
		}
	})
}

// TestZoneFlagsRefused checks that zone settings that cannot work are
// refused, by Validate and by New, and that a good one is not.
func TestZoneFlagsRefused(t *testing.T) {
	const s1, s2, s3 = "127.0.0.1:11001", "127.0.0.1:11002", "127.0.0.1:11003"
	good := func() Config { return zonedConfig("a", "a="+s1+","+s2, "b="+s3) }
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"zones without --zone", func(c *Config) { c.Zone = "" }},
		{"--zone not among the zones", func(c *Config) { c.Zone = "z" }},
		{"--upstream and --upstream-zone", func(c *Config) { c.Upstreams = []string{s1} }},
		{"no =", func(c *Config) { c.ZoneUpstreams[1] = "b" + s3 }},
		{"empty name", func(c *Config) { c.ZoneUpstreams[1] = "=" + s3 }},
		{"blank name", func(c *Config) { c.ZoneUpstreams[1] = " =" + s3 }},
		{"no entries", func(c *Config) { c.ZoneUpstreams[1] = "b=" }},
		{"empty entry", func(c *Config) { c.ZoneUpstreams[1] = "b=" + s3 + "," }},
		{"bad entry", func(c *Config) { c.ZoneUpstreams[1] = "b=nowhere" }},
		{"bad port", func(c *Config) { c.ZoneUpstreams[1] = "b=127.0.0.1:0" }},
		{"zone given twice", func(c *Config) { c.ZoneUpstreams[1] = "a=" + s3 }},
		{"server in two zones", func(c *Config) { c.ZoneUpstreams[1] = "b=" + s2 }},
		{"--zone without zones", func(c *Config) { c.ZoneUpstreams, c.Upstreams = nil, []string{s1} }},
		{"bad --zone-writes", func(c *Config) { c.ZoneWrites = "some" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.edit(&cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatalf("Validate accepted Zone %q ZoneUpstreams %q Upstreams %q ZoneWrites %q", cfg.Zone, cfg.ZoneUpstreams, cfg.Upstreams, cfg.ZoneWrites)
			}
			if p, err := New(cfg, "mcsidecar-test", nil); err == nil {
				p.Shutdown(t.Context())
				t.Fatalf("New accepted what Validate refused (%v)", err)
			}
		})
	}
	for _, writes := range []string{zones.WritesAll, zones.WritesLocal} {
		cfg := good()
		cfg.ZoneWrites = writes
		if err := cfg.Validate(); err != nil {
			t.Errorf("a good zone configuration with --zone-writes=%s: %v", writes, err)
		}
	}
	cfg := good()
	cfg.Zone = "b"
	if err := cfg.Validate(); err != nil {
		t.Errorf("a sidecar of the last zone: %v", err)
	}
}

// TestMemccapableOverZones runs libmemcached's compliance checker against
// a sidecar of zone a over two zones; it must pass 27 of 27.
func TestMemccapableOverZones(t *testing.T) {
	spare := startMemcached(t) // zone b when there is one server to split
	runMemccapable(t, func(ups ...string) Config {
		if len(ups) == 1 {
			return zonedConfig("a", zoneEntry("a", ups), zoneEntry("b", []string{spare}))
		}
		half := (len(ups) + 1) / 2
		return zonedConfig("a", zoneEntry("a", ups[:half]), zoneEntry("b", ups[half:]))
	})
}

// TestZoneFillSkipsRefusedHits checks that a hit another zone holds but
// the client gets as a miss (a damaged envelope) is not filled into the
// local zone, on one event loop and on two, while a good hit in the same
// get is.
func TestZoneFillSkipsRefusedHits(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("event-loops=%d", loops), func(t *testing.T) {
			a, b := startZone(t, 1), startZone(t, 1)
			cfg := zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b))
			cfg.Codec = codecConfig()
			cfg.EventLoops = loops
			_, addr := startProxy(t, cfg)
			sc := newLineClient(t, addr)
			value := strings.Repeat("postings 1234567 ", 20)
			for _, k := range []string{"P2:bad", "P2:good"} {
				if r := sc.do(fmt.Sprintf("set %s 7 0 %d\r\n%s\r\n", k, len(value), value)); r != "STORED\r\n" {
					t.Fatalf("set %s: %q", k, r)
				}
				if r := directDo(t, a[0], "delete "+k+"\r\n"); r != "DELETED\r\n" {
					t.Fatalf("delete %s from zone a: %q", k, r)
				}
			}
			inB := newLineClient(t, b[0])
			flags, stored, _ := rawItem(t, inB, "P2:bad")
			damaged := []byte(stored)
			damaged[len(damaged)/2] ^= 1
			rawSet(t, inB, "P2:bad", flags, string(damaged))

			want := "VALUE P2:good 7 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\nEND\r\n"
			if got := sc.do("get P2:bad P2:good\r\n"); got != want {
				t.Fatalf("get answered %q, want %q", short(got), short(want))
			}
			// Both fills would go in one batch: once the good one is in,
			// the damaged one would be too.
			if !waitFor(5*time.Second, func() bool { _, _, ok := inZone(t, a, "P2:good"); return ok }) {
				t.Fatal("the good hit was not filled into zone a")
			}
			if _, _, ok := inZone(t, a, "P2:bad"); ok {
				t.Error("the damaged hit was filled into zone a")
			}
		})
	}
}
