package proxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"mcsidecar/codec"
	"mcsidecar/proxy/stats"
)

// codecConfig is the codec's default configuration.
func codecConfig() *codec.Config {
	return &codec.Config{
		FlagBit:    codec.DefaultFlagBit,
		Prefixes:   codec.DefaultPrefixes,
		MinSize:    64,
		MinSavings: 0.1,
	}
}

// envelopeAllConfig is testConfig with every value enveloped.
func envelopeAllConfig(upstreams ...string) Config {
	cfg := testConfig(upstreams...)
	cfg.Codec = codecConfig()
	cfg.EnvelopeAll = true
	return cfg
}

// envelopeAllWant are the differential cases whose replies differ from
// memcached's on purpose when every value is enveloped.
var envelopeAllWant = map[string]string{
	// SPEC §4: the item-size limit applies to the stored bytes, so a value
	// that only fits compressed is stored.
	"value of exactly 1 MiB is too large for memcached": "STORED\r\nSTORED\r\nVALUE big 0 1048576\r\n" +
		strings.Repeat("y", 1<<20) + "\r\nEND\r\n",
}

// codecDiffCases are differential cases aimed at the read-modify-write and
// the flags of enveloped items; they run with every value enveloped.
var codecDiffCases = []diffCase{
	{name: "incr parses like strtoull", chunks: req("set n 0 0 5\r\n +12 \r\nincr n 1\r\nget n\r\n" +
		"set n 0 0 2\r\n-5\r\nincr n 1\r\nset n 0 0 2\r\n-0\r\nincr n 1\r\nset n 0 0 5\r\n12abc\r\nincr n 1\r\n" +
		"set n 0 0 1\r\n \r\nincr n 1\r\nset n 0 0 0\r\n\r\nincr n 1\r\nset n 0 0 3\r\n7\t8\r\nincr n 1\r\nget n\r\n")},
	{name: "decr stops at zero and keeps the width", chunks: req("set n 5 0 3\r\n100\r\ndecr n 1000\r\nget n\r\nincr n 18446744073709551615\r\nincr n 2\r\n")},
	{name: "append then incr", chunks: req("set n 9 0 1\r\n1\r\nappend n 0 0 1\r\n2\r\nprepend n 0 0 1\r\n3\r\nincr n 1\r\nget n\r\n")},
	{name: "append to an empty value and prepend to missing", chunks: req("set a 0 0 0\r\n\r\nappend a 7 0 1\r\nx\r\nprepend b 0 0 1\r\ny\r\nget a b\r\n")},
	{name: "flags of every width come back", chunks: req("set a 1073741824 0 1\r\n1\r\nset b 4294967295 0 1\r\n2\r\nset c 1073741825 0 1\r\n3\r\nset d 0 0 1\r\n4\r\nget a b c d\r\n")},
	{name: "cas refused and missing", chunks: req("set a 0 0 1\r\n1\r\ncas a 0 0 1 999999\r\n2\r\ncas z 0 0 1 1\r\n3\r\nget a\r\n")},
	{name: "touch and gat keep the value", chunks: req("set a 3 0 2\r\nhi\r\ntouch a 100\r\ngat 100 a\r\nappend a 0 0 1\r\n!\r\nget a\r\n")},
	{name: "append noreply and incr noreply", chunks: req("set n 0 0 1\r\n1\r\nappend n 0 0 1 noreply\r\n0\r\nincr n 1 noreply\r\nget n\r\n")},
}

// TestDifferentialEnvelopeAll runs every differential case through a proxy
// that envelopes every value: replies must still be memcached's.
func TestDifferentialEnvelopeAll(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases, codecDiffCases), 1, envelopeAllConfig, envelopeAllWant)
}

// TestMemccapableEnvelopeAll runs libmemcached's compliance checker against
// a proxy that envelopes every value, with one upstream server and with
// three.
func TestMemccapableEnvelopeAll(t *testing.T) { runMemccapable(t, envelopeAllConfig) }

// TestDifferentialEnvelopeAllThreeServers runs the cases through a proxy
// that envelopes every value and spreads keys over three servers.
func TestDifferentialEnvelopeAllThreeServers(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases, codecDiffCases), 3, envelopeAllConfig, envelopeAllWant)
}

// rawItem reads key straight from memcached: its stored flags and bytes.
func rawItem(t *testing.T, lc *lineClient, key string) (flags uint32, data string, ok bool) {
	t.Helper()
	reply := lc.do("get " + key + "\r\n")
	if reply == "END\r\n" {
		return 0, "", false
	}
	head, rest, _ := strings.Cut(reply, "\r\n")
	f := strings.Fields(head)
	if len(f) != 4 || f[0] != "VALUE" || f[1] != key {
		t.Fatalf("get %s: %q", key, short(reply))
	}
	n, _ := strconv.Atoi(f[3])
	fl, _ := strconv.ParseUint(f[2], 10, 32)
	return uint32(fl), rest[:n], true
}

// rawSet stores data under key straight in memcached.
func rawSet(t *testing.T, lc *lineClient, key string, flags uint32, data string) {
	t.Helper()
	req := fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", key, flags, len(data), data)
	if r := lc.do(req); r != "STORED\r\n" {
		t.Fatalf("direct set %s: %q", key, r)
	}
}

// codecMetrics registers the proxy's metrics in a registry of their own.
func codecMetrics(t *testing.T, p *Proxy) *prometheus.Registry {
	t.Helper()
	reg := registry(t, p)
	return reg
}

// refusedExposition is the refused-envelope counter with the given counts,
// every other reason at zero.
func refusedExposition(counts map[codec.Reason]int) string {
	var b strings.Builder
	b.WriteString("# HELP mcsidecar_codec_verification_failures_total Enveloped items read from upstream that failed verification and were served as a miss, by reason.\n")
	b.WriteString("# TYPE mcsidecar_codec_verification_failures_total counter\n")
	for _, r := range codec.Reasons() {
		fmt.Fprintf(&b, "mcsidecar_codec_verification_failures_total{reason=%q} %d\n", r.String(), counts[r])
	}
	return b.String()
}

func TestCorruptedItemIsAMissCountedByReason(t *testing.T) {
	up := startMemcached(t)
	value := strings.Repeat("postings 1234567 ", 20)
	for _, del := range []bool{false, true} {
		t.Run(fmt.Sprintf("delete corrupt %v", del), func(t *testing.T) {
			cfg := testConfig(up)
			cfg.Codec = codecConfig()
			cfg.Codec.DeleteCorrupt = del
			p, addr := startProxy(t, cfg)
			reg := codecMetrics(t, p)
			lc, direct := newLineClient(t, addr), newLineClient(t, up)
			key := "P2:corrupt"
			if r := lc.do(fmt.Sprintf("set %s 7 0 %d\r\n%s\r\n", key, len(value), value)); r != "STORED\r\n" {
				t.Fatalf("set: %q", r)
			}
			flags, stored, ok := rawItem(t, direct, key)
			if !ok || flags != 7|1<<codec.DefaultFlagBit || len(stored) >= len(value) {
				t.Fatalf("stored flags %d, %d bytes for a %d-byte value", flags, len(stored), len(value))
			}
			// Every single flipped byte is refused, whatever its place.
			for i := range len(stored) {
				b := []byte(stored)
				b[i] ^= 0x01
				rawSet(t, direct, key, flags, string(b))
				if r := lc.do("get " + key + "\r\n"); r != "END\r\n" {
					t.Fatalf("byte %d flipped: served %q", i, short(r))
				}
				_, _, still := rawItem(t, direct, key)
				if still == del {
					t.Fatalf("byte %d flipped: item left upstream = %v with delete corrupt %v", i, still, del)
				}
			}
			rawSet(t, direct, key, flags, stored)
			if r := lc.do("gets " + key + "\r\n"); !strings.HasPrefix(r, "VALUE "+key+" 7 ") || !strings.Contains(r, value) {
				t.Fatalf("intact item: %q", short(r))
			}
			counts := map[codec.Reason]int{}
			total := 0
			for _, r := range codec.Reasons() {
				counts[r] = int(p.stats.CodecRefused[r].Load())
				total += counts[r]
			}
			if total != len(stored) || counts[codec.ReasonChecksumMismatch] == 0 {
				t.Errorf("refused %v, want %d in all, checksum mismatches among them", counts, len(stored))
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(refusedExposition(counts)), "mcsidecar_codec_verification_failures_total"); err != nil {
				t.Error(err)
			}
			if del && p.stats.CodecDeleted.Load() != uint64(len(stored)) {
				t.Errorf("deleted %d damaged items, want %d", p.stats.CodecDeleted.Load(), len(stored))
			}
		})
	}
}

func TestItemOfAnotherKeyIsAMiss(t *testing.T) {
	up := startMemcached(t)
	cfg := testConfig(up)
	cfg.Codec = codecConfig()
	_, addr := startProxy(t, cfg)
	lc, direct := newLineClient(t, addr), newLineClient(t, up)
	lc.do("set P2:a 0 0 5\r\nalpha\r\n")
	flags, stored, _ := rawItem(t, direct, "P2:a")
	rawSet(t, direct, "P2:b", flags, stored)
	if r := lc.do("get P2:b P2:a\r\n"); r != "VALUE P2:a 0 5\r\nalpha\r\nEND\r\n" {
		t.Errorf("swapped item: %q", r)
	}
}

func TestEnvelopedFlagsComeBackExactly(t *testing.T) {
	up := startMemcached(t)
	cfg := testConfig(up)
	cfg.Codec = codecConfig()
	_, addr := startProxy(t, cfg)
	lc, direct := newLineClient(t, addr), newLineClient(t, up)
	bit := uint32(1) << codec.DefaultFlagBit
	for _, key := range []string{"P2:flags", "plain"} {
		for _, flags := range []uint32{0, 1, 4294967295, bit, bit | 5, bit - 1} {
			lc.do(fmt.Sprintf("set %s %d 0 3\r\nabc\r\n", key, flags))
			want := fmt.Sprintf("VALUE %s %d 3\r\nabc\r\nEND\r\n", key, flags)
			if r := lc.do("get " + key + "\r\n"); r != want {
				t.Errorf("flags %d under %s: %q, want %q", flags, key, r, want)
			}
			// A plain key is enveloped only for flags using the bit.
			stored, _, _ := rawItem(t, direct, key)
			if enveloped := stored&bit != 0; enveloped != (key == "P2:flags" || flags&bit != 0) {
				t.Errorf("flags %d under %s: stored with flags %d", flags, key, stored)
			}
		}
	}
}

func TestValueThatOnlyFitsCompressedIsStored(t *testing.T) {
	up := startMemcached(t)
	cfg := testConfig(up)
	cfg.Codec = codecConfig()
	cfg.MaxValueSize = 2 << 20
	_, addr := startProxy(t, cfg)
	lc := newLineClient(t, addr)
	big := strings.Repeat("series 0001 ", (3<<19)/12) // 1.5 MiB
	if r := lc.do(fmt.Sprintf("set P2:big 3 0 %d\r\n%s\r\n", len(big), big)); r != "STORED\r\n" {
		t.Fatalf("compressible 1.5 MiB: %q", r)
	}
	if r := lc.do("get P2:big\r\n"); r != fmt.Sprintf("VALUE P2:big 3 %d\r\n%s\r\nEND\r\n", len(big), big) {
		t.Fatalf("get: %q", short(r))
	}
	// Not under a plain key: its value is stored as it is.
	if r := lc.do(fmt.Sprintf("set plain 0 0 %d\r\n%s\r\n", len(big), big)); r != "SERVER_ERROR object too large for cache\r\n" {
		t.Errorf("plain 1.5 MiB: %q", r)
	}
	// Incompressible over the item limit, and anything over the value limit:
	// refused, data block consumed.
	noise := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(noise)
	for _, v := range []string{string(noise), strings.Repeat("a", 2<<20+1)} {
		if r := lc.do(fmt.Sprintf("set P2:big 0 0 %d\r\n%s\r\n", len(v), v)); r != "SERVER_ERROR object too large for cache\r\n" {
			t.Errorf("%d bytes: %q", len(v), r)
		}
		// memcached drops the old value on a set it refuses.
		if r := lc.do("get P2:big\r\n"); r != "END\r\n" {
			t.Errorf("after a refused set: %q", short(r))
		}
	}
}

func TestCompressionShrinksWhatMemcachedHolds(t *testing.T) {
	withCodec, without := startMemcached(t), startMemcached(t)
	cfg := testConfig(withCodec)
	cfg.Codec = codecConfig()
	p, addr := startProxy(t, cfg)
	_, plainAddr := startProxy(t, testConfig(without))
	var b strings.Builder
	for i := range 8000 {
		fmt.Fprintf(&b, "%08x", 1000+i*7)
	}
	value := b.String()
	for _, a := range []string{addr, plainAddr} {
		lc := newLineClient(t, a)
		for i := range 20 {
			if r := lc.do(fmt.Sprintf("set P2:%d 0 0 %d\r\n%s\r\n", i, len(value), value)); r != "STORED\r\n" {
				t.Fatal(r)
			}
		}
	}
	bytesWith, bytesWithout := newLineClient(t, withCodec).stat("bytes"), newLineClient(t, without).stat("bytes")
	t.Logf("memcached bytes: %d with the codec, %d without", bytesWith, bytesWithout)
	if bytesWith*4 > bytesWithout*3 {
		t.Errorf("memcached holds %d bytes with the codec, %d without", bytesWith, bytesWithout)
	}
	logical, stored := p.stats.CodecLogical.Load(), p.stats.CodecStored.Load()
	if logical != uint64(20*len(value)) || stored == 0 || stored*4 > logical*3 {
		t.Errorf("written %d logical bytes, %d stored", logical, stored)
	}
	want := fmt.Sprintf(`# HELP mcsidecar_codec_written_logical_bytes_total Bytes of enveloped values written, as the clients sent them. The saving is 1 - stored/logical.
# TYPE mcsidecar_codec_written_logical_bytes_total counter
mcsidecar_codec_written_logical_bytes_total %d
# HELP mcsidecar_codec_written_stored_bytes_total Bytes of enveloped values written, as memcached holds them (envelope included).
# TYPE mcsidecar_codec_written_stored_bytes_total counter
mcsidecar_codec_written_stored_bytes_total %d
`, logical, stored)
	if err := testutil.GatherAndCompare(codecMetrics(t, p), strings.NewReader(want),
		"mcsidecar_codec_written_logical_bytes_total", "mcsidecar_codec_written_stored_bytes_total"); err != nil {
		t.Error(err)
	}
}

func TestConcurrentIncrOfEnvelopedCounterLosesNoUpdate(t *testing.T) {
	cfg := testConfig(startMemcached(t))
	cfg.Codec = codecConfig()
	_, addr := startProxy(t, cfg)
	newLineClient(t, addr).do("set P2:n 0 0 1\r\n0\r\n")
	const workers, each = 4, 50
	done := make(chan int)
	for range workers {
		go func() {
			lc := newLineClient(t, addr)
			ok := 0
			for range each {
				if r := lc.do("incr P2:n 1\r\n"); !strings.HasPrefix(r, "SERVER_ERROR") {
					ok++
				} else {
					t.Log(r)
				}
			}
			done <- ok
		}()
	}
	total := 0
	for range workers {
		total += <-done
	}
	want := fmt.Sprintf("VALUE P2:n 0 %d\r\n%d", len(strconv.Itoa(total)), total)
	if r := newLineClient(t, addr).do("get P2:n\r\n"); !strings.HasPrefix(r, want) {
		t.Errorf("after %d incrs: %q", total, r)
	}
	t.Logf("%d of %d incrs succeeded", total, workers*each)
}

func TestParseCounterIsMemcachedsStrtoull(t *testing.T) {
	for _, tc := range []struct {
		in string
		n  uint64
		ok bool
	}{
		{"12", 12, true}, {" 12 ", 12, true}, {"+7", 7, true}, {"-0", 0, true},
		{"12abc", 0, false}, {"", 0, false}, {" ", 0, false}, {"-5", 0, false},
		{"18446744073709551615", 1<<64 - 1, true}, {"18446744073709551616", 0, false},
		{"-18446744073709551615", 1, true}, {"3\x00junk", 3, true},
	} {
		n, ok := parseCounter([]byte(tc.in))
		if n != tc.n || ok != tc.ok {
			t.Errorf("parseCounter(%q) = %d, %v; want %d, %v", tc.in, n, ok, tc.n, tc.ok)
		}
	}
}

func TestJoinAndArithmeticOnEnvelopedItemKeepTTL(t *testing.T) {
	up := startMemcached(t)
	cfg := testConfig(up)
	cfg.Codec = codecConfig()
	_, addr := startProxy(t, cfg)
	lc, direct := newLineClient(t, addr), newLineClient(t, up)
	ttl := func(key string) string {
		t.Helper()
		r := lc.do("get " + key + "\r\n") // through the proxy, to be sure it is a hit
		if r == "END\r\n" {
			t.Fatalf("%s is gone", key)
		}
		line := direct.do("mg " + key + " t\r\n")
		return strings.TrimSpace(strings.TrimPrefix(line, "HD "))
	}
	for _, tc := range []struct{ exptime, want string }{{"0", "t-1"}, {"1000", "t1000"}} {
		lc.do("set P2:j 0 " + tc.exptime + " 1\r\n1\r\n")
		for _, op := range []string{"append P2:j 0 0 1\r\n2\r\n", "prepend P2:j 0 0 1\r\n3\r\n", "incr P2:j 5\r\n", "decr P2:j 1\r\n"} {
			lc.do(op)
			if got := ttl("P2:j"); got != tc.want && !(tc.want == "t1000" && got == "t999") {
				t.Errorf("exptime %s, after %q: %s", tc.exptime, op, got)
			}
		}
		if r := lc.do("get P2:j\r\n"); r != "VALUE P2:j 0 3\r\n316\r\nEND\r\n" {
			t.Errorf("value: %q", r)
		}
	}
}

func TestEnvelopingReusesConnectionBuffers(t *testing.T) {
	cd, err := codec.New(*codecConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := &conn{p: &Proxy{codec: cd, cfg: Config{Codec: codecConfig()}, stats: stats.New()}}
	key := []byte("P2:tenant:block:postings")
	value := []byte(strings.Repeat("series 12345 ", 80))
	roundTrip := func() {
		stored, flags := c.encodeFor(key, false, false, 3, value)
		got, f, ok, _ := c.openValue(key, false, flags, stored)
		if !ok || f != 3 || string(got) != string(value) {
			t.Fatalf("round trip: ok %v, flags %d", ok, f)
		}
	}
	roundTrip()
	if allocs := testing.AllocsPerRun(100, roundTrip); allocs != 0 {
		t.Errorf("%.1f allocations per encode and decode, want 0", allocs)
	}
}

// BenchmarkEndToEndEnveloped measures a set and a get of a compressible
// 1 KiB value of a postings key through the proxy with the codec, against
// the same through the proxy without it: the cost of enveloping on the
// request path.
func BenchmarkEndToEndEnveloped(b *testing.B) {
	plain := testConfig(startMemcached(b))
	withCodec := testConfig(startMemcached(b))
	withCodec.Codec = codecConfig()
	_, plainAddr := startProxy(b, plain)
	_, codecAddr := startProxy(b, withCodec)
	value := strings.Repeat("series 0001 ", 86)[:1024]
	setReq := []byte("set P2:bench 0 0 1024\r\n" + value + "\r\n")
	getReq := []byte("get P2:bench\r\n")
	for _, target := range []struct{ name, addr string }{{"plain", plainAddr}, {"codec", codecAddr}} {
		if err := newRawClient(b, target.addr).roundTrip(setReq, "STORED"); err != nil {
			b.Fatal(err)
		}
		for _, op := range []struct {
			name, end string
			req       []byte
		}{{"get", "END", getReq}, {"set", "STORED", setReq}} {
			b.Run(op.name+"/"+target.name, func(b *testing.B) { benchRoundTrips(b, target.addr, op.req, op.end) })
		}
	}
}
