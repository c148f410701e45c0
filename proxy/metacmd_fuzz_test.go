package proxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"

	"mcsidecar/proxy/internal/wire"
)

// metaSeedLines are the meta command lines of the differential scripts.
func metaSeedLines() []string {
	var lines []string
	for _, tc := range slices.Concat(metaDiffCases, metaSeparately) {
		for _, l := range strings.Split(strings.Join(tc.chunks, ""), "\r\n") {
			if strings.HasPrefix(strings.TrimLeft(l, " "), "m") {
				lines = append(lines, l)
			}
		}
	}
	return lines
}

// FuzzMetaRequest feeds arbitrary lines to the meta request parser, as the
// connection hands them over: split by wire.ParseLine, then read by wire.ParseMeta
// with memcached's key limit and without it. It must never panic (every
// read out of bounds would), and what it accepts must be what memcached
// accepts: known flags, each once, an opaque within its limit, and a key
// that is a slice of the line or its base64 decoding. Seeds are the lines
// of the differential scripts.
func FuzzMetaRequest(f *testing.F) {
	for _, l := range metaSeedLines() {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i] // the reader hands over one line, without its end
		}
		if i := bytes.IndexByte(line, 0); i >= 0 {
			line = line[:i]
		}
		cmd, words, v := wire.ParseLine(make([][]byte, 0, wire.MaxTokens), line)
		if v != wire.VerdictRun || cmd.ID < wire.CmdMetaGet || cmd.ID > wire.CmdMetaDebug {
			return
		}
		var m wire.Meta
		for _, limit := range []bool{true, false} {
			wire.ParseMeta(&m, words, limit)
			checkMetaReq(t, &m, line, words, limit)
		}
	})
}

// checkMetaReq checks what parseMeta made of words.
func checkMetaReq(t *testing.T, m *wire.Meta, line []byte, words [][]byte, limit bool) {
	t.Helper()
	if m.Verb != words[0][1] {
		t.Fatalf("%q: verb %q", line, m.Verb)
	}
	if m.Err != nil || m.Verb == 'n' {
		return
	}
	if limit && len(m.Raw) > wire.KeyMaxLength {
		t.Fatalf("%q: accepted a %d-byte key", line, len(m.Raw))
	}
	if !m.Bin && !bytes.Equal(m.Key, m.Raw) || m.Bin && len(m.Key) == 0 {
		t.Fatalf("%q: key %q from %q", line, m.Key, m.Raw)
	}
	if m.Bin {
		// Canonical base64 must decode as the standard library does.
		if std, err := base64.StdEncoding.DecodeString(string(m.Raw)); err == nil && !bytes.Equal(std, m.Key) {
			t.Fatalf("%q: decoded %q, want %q", line, m.Key, std)
		}
	}
	if m.Verb == 'e' {
		return
	}
	if len(words)+1 > wire.MetaMaxTokens {
		t.Fatalf("%q: accepted %d tokens", line, len(words)+1)
	}
	var seen uint64
	for _, f := range m.Flags[:m.NFlags] {
		if strings.IndexByte(wire.MetaFlagLetters, f[0]) < 0 || seen&wire.MetaFlagBit(f[0]) != 0 {
			t.Fatalf("%q: accepted flag %q", line, f)
		}
		seen |= wire.MetaFlagBit(f[0])
	}
	if len(m.Opaque) > wire.MetaMaxOpaque {
		t.Fatalf("%q: accepted opaque %q", line, m.Opaque)
	}
	if m.Verb == 's' && (!m.VlenOK || m.Vlen < 0) {
		t.Fatalf("%q: accepted length %d", line, m.Vlen)
	}
}

// FuzzMetaBase64 checks the key decoder against the standard library: a
// key encoded the standard way decodes to itself, and no input panics.
func FuzzMetaBase64(f *testing.F) {
	for _, s := range []string{"Zm9v", "YQ==", "YWI=", "!!!", "====", "Zm=9v", "QUJD"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		wire.AppendBase64Decode(nil, b)
		if len(b) == 0 {
			return
		}
		enc := wire.AppendBase64(nil, b)
		if want := base64.StdEncoding.EncodeToString(b); string(enc) != want {
			t.Fatalf("encode %q = %q, want %q", b, enc, want)
		}
		if dec := wire.AppendBase64Decode(nil, enc); !bytes.Equal(dec, b) {
			t.Fatalf("decode(encode(%q)) = %q", b, dec)
		}
	})
}

// metaParseLines are the lines the parse benchmarks read: a meta get as a
// cache client sends it (value, flags, TTL, CAS, opaque, quiet) and a meta
// set with flags, TTL, mode and opaque.
var metaParseLines = []struct{ name, line string }{
	{"mg", "mg P2:tenant-1:01HZ0000000000000000000000:bmFtZTp2YWx1ZQ v f t c O123 q k"},
	{"ms", "ms S:tenant-1:01HZ0000000000000000000000:123456 16 F0 T604800 MS O7 q c"},
	{"mg base64", "mg UDI6dGVuYW50LTE6MDFIWjAwMDAwMDAwMDAwMDAwMDAwMDAwMDA= b v f O1"},
}

// BenchmarkMetaParse measures splitting a meta line and reading its flags
// as the connection does for every meta request; both must allocate
// nothing once the connection's buffers exist.
func BenchmarkMetaParse(b *testing.B) {
	for _, tc := range metaParseLines {
		b.Run(tc.name, func(b *testing.B) {
			line := []byte(tc.line)
			words := make([][]byte, 0, wire.MaxTokens)
			var m wire.Meta
			b.ReportAllocs()
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				var v wire.Verdict
				_, words, v = wire.ParseLine(words, line)
				wire.ParseMeta(&m, words, true)
				if v != wire.VerdictRun || m.Err != nil {
					b.Fatalf("%q: %q", line, m.Err)
				}
			}
		})
	}
}

// TestMetaParseAllocatesNothing holds the benchmark's promise in the test
// suite.
func TestMetaParseAllocatesNothing(t *testing.T) {
	for _, tc := range metaParseLines {
		line := []byte(tc.line)
		words := make([][]byte, 0, wire.MaxTokens)
		var m wire.Meta
		wire.ParseMeta(&m, [][]byte{[]byte("mg"), []byte("Zm9v"), []byte("b")}, true) // grows keyBuf
		allocs := testing.AllocsPerRun(100, func() {
			_, words, _ = wire.ParseLine(words, line)
			wire.ParseMeta(&m, words, true)
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per parse", tc.name, allocs)
		}
	}
}

// FuzzMetaDifferential sends arbitrary meta lines to memcached and to the
// proxy in front of another memcached and compares the replies byte for
// byte: the parser must refuse what memcached refuses, with its words, and
// accept what it accepts. Seeds are the lines of the differential scripts.
// The memcached behind the proxy must then have stored as often as
// memcached alone, in the same order: the next CAS value of each is the
// same.
func FuzzMetaDifferential(f *testing.F) { fuzzMetaDifferential(f, testConfig, false) }

// FuzzMetaDifferentialEnvelopeAll is FuzzMetaDifferential through a proxy
// that envelopes every value: the client must not see the envelope. me is
// left out: it tells the size memcached holds, the envelope's.
func FuzzMetaDifferentialEnvelopeAll(f *testing.F) {
	fuzzMetaDifferential(f, envelopeAllConfig, true)
}

// casProbe stores an item and reads its CAS value: memcached's count of
// the items it stored, plus one.
const casProbe = "set zzprobe 0 0 1\r\n1\r\ngets zzprobe\r\n"

func fuzzMetaDifferential(f *testing.F, config func(...string) Config, withoutDebug bool) {
	for _, l := range metaSeedLines() {
		f.Add([]byte(l))
	}
	// Pipelined reads, which the proxy fetches ahead of their turn.
	for _, l := range []string{
		"mg a v\nmg b v q\nmg a v k\nmg c s f O1\nmn",
		"mg a v\nms a 2\nmg a v t\nmd a I q\nmg a v\nmg a v c\nmn",
		"mg a v q\nmg zz v q\nmg a v Zz\nmg a k b\nmg YQ== b v\nmn",
	} {
		f.Add([]byte(l))
	}
	direct, upstream := startMemcached(f), startMemcached(f)
	_, addr := startProxy(f, config(upstream))
	f.Fuzz(func(t *testing.T, input []byte) {
		req := metaFuzzRequest(input, withoutDebug)
		if req == nil {
			return
		}
		// Both start from an empty cache, with one item to find.
		const setup = "flush_all\r\nset a 1 0 2\r\n10\r\n"
		exchange(t, direct, setup)
		exchange(t, addr, setup)
		// An mn last: its reply comes once every request before it is
		// done, quiet ones included.
		req = append(req, "mn\r\n"...)
		want := exchange(t, direct, string(req))
		got := exchange(t, addr, string(req))
		if got != want {
			t.Fatalf("request %q\nproxy     %q\nmemcached %q", req, short(got), short(want))
		}
		if withoutDebug {
			return // an enveloped value may take a read and a write for a command
		}
		if a, b := exchange(t, direct, casProbe), exchange(t, upstream, casProbe); a != b {
			t.Fatalf("request %q: memcached stored other items alone than behind the proxy, or in another order: next CAS %q alone, %q behind", req, a, b)
		}
	})
}

// metaFuzzRequest makes a request of the meta lines of input. An ms line
// is followed by a data block of the length it names (ms lines naming more
// than 2000 bytes are left out: memcached holds its answer to a refused ms
// until the block it swallows has come). Lines where the proxy differs on
// purpose are left out: keys holding a control byte, and ms lines with a
// key over 250 bytes or too many flags (it consumes the block).
func metaFuzzRequest(input []byte, withoutDebug bool) []byte {
	var req []byte
	for _, l := range bytes.Split(input, []byte("\n")) {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if i := bytes.IndexByte(l, 0); i >= 0 {
			l = l[:i]
		}
		if len(l) > wire.LineLimit {
			continue
		}
		w := bytes.Fields(bytes.ReplaceAll(l, []byte("\t"), []byte("x")))
		if len(w) == 0 || len(w[0]) != 2 || w[0][0] != 'm' || withoutDebug && w[0][1] == 'e' {
			continue
		}
		words, _ := wire.Tokenize(nil, l, wire.MaxTokens-1)
		if len(words) > 1 && !wire.Forwardable(words[1]) {
			continue
		}
		if shortLived(words) {
			continue
		}
		var block []byte
		if w[0][1] == 's' {
			if len(words) > 1 && len(words[1]) > wire.KeyMaxLength || len(words)+1 > wire.MetaMaxTokens {
				continue
			}
			if len(words) > 2 {
				n, ok := wire.ParseInt32(words[2])
				if ok && n > 2000 {
					continue
				}
				if ok && n >= 0 {
					block = append(bytes.Repeat([]byte("d"), int(n)), "\r\n"...)
				}
			}
		}
		req = append(append(append(req, l...), "\r\n"...), block...)
	}
	return req
}

// shortLived reports whether a meta line gives an item a time to live (T
// or N) of a minute or less: it may run out between memcached's answer and
// the proxy's on a slow machine, and their replies then differ by the
// clock, not by the proxy.
func shortLived(words [][]byte) bool {
	for _, w := range words[min(2, len(words)):] {
		if len(w) > 1 && (w[0] == 'T' || w[0] == 'N') {
			if n, ok := wire.ParseInt32(w[1:]); ok && n > 0 && n <= 60 {
				return true
			}
		}
	}
	return false
}

// BenchmarkMetaEndToEnd measures a meta get and a meta set of a 1 KiB
// value through the proxy beside the classic get and set, one connection,
// one request at a time: what the meta path (its own parse, the reply
// rebuilt in the client's flag order) costs over the classic one. mg1000
// is a meta client's pipelined read: 1000 mg of distinct keys, then mn, more
// than one read of the connection's buffer takes.
func BenchmarkMetaEndToEnd(b *testing.B) {
	mc := startMemcached(b)
	_, px := startProxy(b, testConfig(mc))
	value := strings.Repeat("v", 1024)
	if err := newRawClient(b, mc).roundTrip([]byte("set bench:key 0 0 1024\r\n"+value+"\r\n"), "STORED"); err != nil {
		b.Fatal(err)
	}
	var sets, mgs strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&sets, "set bench:k%d 0 0 100 noreply\r\n%s\r\n", i, value[:100])
		fmt.Fprintf(&mgs, "mg bench:k%d v f\r\n", i)
	}
	sets.WriteString("mn\r\n")
	mgs.WriteString("mn\r\n")
	if err := newRawClient(b, mc).roundTrip([]byte(sets.String()), "MN"); err != nil {
		b.Fatal(err)
	}
	for _, op := range []struct{ name, req, end string }{
		{"get", "get bench:key\r\n", "END"},
		{"mg", "mg bench:key v f t O1\r\nmn\r\n", "MN"},
		{"set", "set bench:key 0 0 1024\r\n" + value + "\r\n", "STORED"},
		{"ms", "ms bench:key 1024 T0 F0 O1\r\n" + value + "\r\n", "HD"},
		{"mg1000", mgs.String(), "MN"},
	} {
		b.Run(op.name, func(b *testing.B) { benchRoundTrips(b, px, []byte(op.req), op.end) })
	}
}
