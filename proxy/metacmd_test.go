package proxy

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	opaque33   = "O" + strings.Repeat("o", 32) // one byte over memcached's opaque limit
	opaque32   = "O" + strings.Repeat("o", 31)
	b64key248  = strings.Repeat("QUJD", 61) + "QQ=="      // 248 bytes of base64
	b64key252  = strings.Repeat("QUJD", 63)               // 252 bytes of base64, 189 decoded
	metaFlags1 = "s t c f l h v u k O1 P L q F1 C1 MS J1" // 19 words with "mg foo"
)

// metaDiffCases are meta command scripts sent byte for byte to memcached
// and to the proxy, as diffCases are: every flag memcached 1.6.18 knows,
// its errors, quiet mode, and pipelines that mix meta and classic commands.
var metaDiffCases = []diffCase{
	// mg
	{name: "mg of a missing key", chunks: req("mg foo v\r\nmg foo\r\nmg foo s v t c f k O123\r\n")},
	{name: "mg hit with every return flag", chunks: req("set foo 5 0 3\r\nabc\r\nmg foo s v t c f l h k O1 u\r\nmg foo h l\r\n"), exactCAS: true},
	{name: "mg hit without v is HD", chunks: req("set foo 0 0 1\r\nx\r\nmg foo\r\nmg foo k\r\nmg foo s f\r\n")},
	{name: "mg quiet hides only the miss", chunks: req("mg foo v q O1\r\nset foo 0 0 1\r\nx\r\nmg foo v q O2\r\nmg foo q\r\nmn\r\n")},
	{name: "mg miss returns opaque and key", chunks: req("mg foo O12345 k v\r\nmg foo k O9\r\n")},
	{name: "mg opaque of 32 bytes and of 33", chunks: req("mg foo " + opaque32 + "\r\nmg foo " + opaque33 + "\r\nset foo 0 0 1\r\nx\r\nmg foo v " + opaque33 + "\r\nmg foo " + opaque32 + " v\r\n")},
	{name: "mg base64 key finds a classic key", chunks: req("set foo 0 0 2\r\nhi\r\nmg Zm9v b v k\r\nmg Zm9v b k v q\r\nmg YmFy b k\r\nmg YmFy k b q\r\nmn\r\n")},
	{name: "ms base64 key is binary for k and me", chunks: req("ms Zm9v 2 b\r\nhi\r\nmg foo k v\r\nmg Zm9v b k s\r\nget foo\r\nmd Zm9v b k\r\n")},
	{name: "base64 keys that do not decode", chunks: req("mg !!! b v\r\nmg Zm9 b\r\nms ==== 1 b\r\nx\r\nmd !! b\r\nma !! b\r\nmg Zm=9v b k\r\nmg Z!m9v b k\r\n")},
	{name: "base64 key with padding", chunks: req("ms YQ== 1 b\r\nx\r\nget a\r\nmg YWI= b v k\r\nmg YQ== b k v\r\n")},
	{name: "mg N vivifies and wins once", chunks: req("mg foo N30 v c t s\r\nmg foo v t\r\nmg foo v\r\nmg foo N30 k\r\n"), exactCAS: true},
	{name: "mg R wins a recache below the TTL", chunks: req("set foo 0 100 1\r\nx\r\nmg foo R200 v\r\nmg foo R200 v\r\nmg foo R50 v\r\nset bar 0 0 1\r\ny\r\nmg bar R50 v\r\n")},
	{name: "mg T touches", chunks: req("set foo 0 0 1\r\nx\r\nmg foo T100 t v\r\nmg foo t\r\nmg foo T0 t\r\nmg foo t T50\r\nmg foo t\r\nmg bar T10 t\r\n")},
	{name: "mg with bad tokens", chunks: req("mg foo Tx\r\nmg foo N\r\nmg foo R-\r\nmg foo T1 Nx Rz\r\nmg foo C\r\nmg foo Fx\r\nmg foo Fx Tx\r\nmg foo D\r\nmg foo J-1\r\nmg foo MAB\r\n")},
	{name: "mg with invalid and repeated flags", chunks: req("mg foo z\r\nmg foo v v\r\nmg foo E1\r\nmg foo \xff\r\nmg foo v Z\r\nmg foo x\r\nmg foo 1\r\nmg foo [\r\n")},
	{name: "mg with 18 flags and with 17", chunks: req("mg foo " + metaFlags1 + " D1\r\nmg foo " + metaFlags1 + "\r\n")},
	{name: "mg without key", chunks: req("mg\r\nmg  \r\n")},
	{name: "mg with 250-byte key", chunks: req("set " + key250 + " 0 0 1\r\nv\r\nmg " + key250 + " v k\r\n")},
	{name: "mg with 251-byte key", chunks: req("mg " + key251 + " v\r\n")},
	{name: "mg base64 key of 248 and 252 bytes", chunks: req("mg " + b64key248 + " b v k\r\nmg " + b64key252 + " b v\r\n")},
	{name: "mg ignores flags of other commands", chunks: req("set foo 0 0 1\r\nx\r\nmg foo F5 C1 MS J1 D1 I P1 Lx v\r\n")},
	{name: "md I makes the item stale for mg", chunks: req("set foo 0 0 1\r\nx\r\nmd foo I\r\nmg foo v c\r\nmg foo v\r\nms foo 1 C3\r\ny\r\nmg foo v\r\n"), exactCAS: true},
	{name: "mg with runs of spaces", chunks: req("set foo 0 0 1\r\nx\r\nmg  foo   v  k \r\n")},
	// ms
	{name: "ms stores flags and value", chunks: req("ms foo 3 F7 T0\r\nabc\r\nget foo\r\nmg foo v f s\r\n")},
	{name: "ms returns c, k and opaque in order", chunks: req("ms foo 2 c k O9\r\nhi\r\nms foo 2 O8 k c\r\nhi\r\n"), exactCAS: true},
	{name: "ms quiet hides HD only", chunks: req("ms foo 2 q\r\nhi\r\nms foo 2 q ME\r\nhi\r\nms bar 1 q MR\r\nx\r\nmn\r\nmg foo v\r\n")},
	{name: "ms add mode", chunks: req("ms foo 1 ME\r\na\r\nms foo 1 ME c\r\nb\r\nmg foo v\r\n")},
	{name: "ms replace mode", chunks: req("ms foo 1 MR\r\na\r\nset foo 0 0 1\r\nx\r\nms foo 1 MR F3\r\nb\r\nmg foo v f\r\n")},
	{name: "ms append and prepend modes keep flags", chunks: req("ms foo 1 MA\r\na\r\nset foo 4 0 1\r\nx\r\nms foo 1 MA F9\r\na\r\nms foo 1 MP k\r\np\r\nmg foo v f s\r\n")},
	{name: "ms set mode", chunks: req("ms foo 1 MS\r\na\r\nmg foo v\r\n")},
	{name: "ms with an invalid mode consumes the block", chunks: req("ms foo 1 MX\r\na\r\nms foo 1 MAA\r\na\r\nmg foo v\r\n")},
	{name: "ms cas wins and loses", chunks: req("ms foo 1\r\na\r\nmg foo c\r\nms foo 1 C1 c\r\nb\r\nms foo 1 C1 c\r\nc\r\nms bar 1 C5\r\nd\r\nmg foo v\r\n"), exactCAS: true},
	{name: "ms cas in append and add modes", chunks: req("ms foo 1\r\na\r\nms foo 1 MA C9\r\nb\r\nms foo 1 MA C1\r\nb\r\nms foo 1 ME C1\r\nc\r\nmg foo v\r\n"), exactCAS: true},
	{name: "ms I with an older cas stores a stale item", chunks: req("ms foo 1\r\na\r\nms foo 1\r\nb\r\nms foo 1 C1 I\r\nc\r\nmg foo v c\r\nmg foo v\r\n"), exactCAS: true},
	{name: "ms bad data chunk", chunks: req("ms foo 1\r\nabc\r\nmg foo v\r\nms foo 1 q\r\nxy\r\nmg foo v\r\n")},
	{name: "ms with a bad length", chunks: req("ms foo x\r\nms foo -1\r\nms foo\r\nms foo 2147483646\r\n")},
	{name: "ms with bad flags consumes the block", chunks: req("ms foo 1 Fx\r\na\r\nms foo 1 zz\r\na\r\nms foo 1 T1 T2\r\na\r\nms foo 1 Tx q\r\na\r\nmg foo v\r\n")},
	{name: "ms with a TTL", chunks: req("ms foo 1 T100\r\na\r\nmg foo t v\r\nms foo 1 T-1\r\na\r\nmg foo v\r\n")},
	{name: "ms N in append mode does not vivify", chunks: req("ms foo 1 MA N100\r\na\r\nmg foo v\r\n")},
	{name: "ms of an empty value and s", chunks: req("ms foo 0 s\r\n\r\nmg foo v s\r\n")},
	{name: "ms opaque too long consumes the block", chunks: req("ms foo 1 " + opaque33 + "\r\na\r\nms foo 1 MX " + opaque33 + "\r\na\r\nmg foo v\r\n")},
	{name: "ms split across reads", chunks: req("ms foo 5 ", "T0 F1\r\nhel", "lo\r\nmg", " foo v f\r\n")},
	{name: "ms of 100 KB", chunks: req("ms big 100000 F3\r\n" + val100k + "\r\nmg big v s f\r\n")},
	// md
	{name: "md hit, miss, key and opaque", chunks: req("set foo 0 0 1\r\nx\r\nmd foo k O1\r\nmd foo k O2\r\nset foo 0 0 1\r\nx\r\nmd foo q\r\nmd foo q O3\r\nmn\r\n")},
	{name: "md with a cas", chunks: req("set foo 0 0 1\r\nx\r\nmd foo C99\r\nmd foo C1 q\r\nmd foo C1\r\n"), exactCAS: true},
	{name: "md I with T marks stale", chunks: req("set foo 0 0 1\r\nx\r\nmd foo I T30\r\nmg foo t v c\r\nmd foo I q\r\nmn\r\n"), exactCAS: true},
	{name: "md with bad flags", chunks: req("md foo x\r\nmd foo zz\r\nmd foo q q\r\nmd foo Tx\r\nmd\r\nmd foo " + opaque33 + "\r\nmd foo " + metaFlags1 + " D1\r\n")},
	// ma
	{name: "ma counts up and down", chunks: req("set n 0 0 2\r\n10\r\nma n\r\nma n v\r\nma n MD D3 v\r\nma n M- D100 v\r\nma n M+ v\r\nma n MI D7 v\r\nmg n v\r\n")},
	{name: "ma N and J vivify", chunks: req("ma n N0 J5 v\r\nma n v\r\nma m N100 v t\r\nma o N0 v t\r\nma p N0\r\nmg p v\r\n")},
	{name: "ma miss returns opaque and key", chunks: req("ma n\r\nma n O1 k q\r\nma n MD\r\nma n v t c\r\n")},
	{name: "ma quiet hides success", chunks: req("set n 0 0 1\r\n1\r\nma n q\r\nma n q v\r\nmn\r\nmg n v\r\n")},
	{name: "ma quiet still answers a creation", chunks: req("ma n N100 v q\r\nma n N100 v q\r\nma m N0 q\r\nma o N0 J5 v q t c O9 k\r\nmn\r\nmg n v\r\n"), exactCAS: true},
	{name: "C0 is no cas for ma, a mismatch for md and ms", chunks: req("set n 0 0 1\r\n1\r\nma n C0 v\r\nms n 1 C0\r\n5\r\nmd n C0\r\nmd x C0\r\nms x 1 C0\r\n5\r\nmg n v\r\n")},
	{name: "ma with a cas", chunks: req("set n 0 0 1\r\n1\r\nma n C99 v\r\nma n C1 v c\r\n"), exactCAS: true},
	{name: "ma with bad flags", chunks: req("ma n D-1\r\nma n Dx\r\nma n Jx N0\r\nma n MX\r\nma n MII\r\nma n " + opaque33 + "\r\nma n " + metaFlags1 + " D1\r\nma\r\n")},
	{name: "ma of a non-numeric value", chunks: req("set n 0 0 1\r\nx\r\nma n\r\nma n q\r\n")},
	{name: "ma wraps at 2^64 and keeps the width", chunks: req("set n 0 0 20\r\n18446744073709551615\r\nma n D2 v\r\nmg n v\r\nset m 0 0 3\r\n100\r\nma m MD D99 v\r\nmg m v s\r\n")},
	{name: "ma t before and after T", chunks: req("set n 0 0 1\r\n1\r\nma n t T100 t v\r\nma n t\r\nma n T0 t\r\n")},
	// mn, me, unknown
	{name: "mn alone and with words", chunks: req("mn\r\nmn foo bar\r\n")},
	{name: "me of a missing key and without key", chunks: req("me foo\r\nme\r\nme foo b\r\nme !! b\r\nme " + key251 + "\r\n")},
	{name: "me of an item", chunks: req("set foo 0 0 1\r\nx\r\nme foo\r\nme Zm9v b\r\nms YmFy 1 b\r\ny\r\nme YmFy b\r\nme bar\r\n"), exactCAS: true},
	{name: "unknown meta verbs", chunks: req("mx foo\r\nm\r\nmgg foo\r\n")},
	// pipelines
	{name: "pipeline mixing meta and classic", chunks: req("set a 1 0 1\r\nA\r\nmg a v f\r\nget a\r\nms a 2 F2\r\nBB\r\ngets a\r\nma n N0 J1\r\nincr n 5\r\nmg n v\r\nmd a\r\ndelete a\r\nmg a v\r\nmn\r\n"), exactCAS: true},
	{name: "quiet pipeline ended by mn", chunks: req("mg a v q\r\nmg b v q k\r\nms c 1 q\r\nx\r\nmg c v q k\r\nmd d q\r\nmd c q\r\nma e q\r\nmn\r\n")},
	{name: "many meta commands in one read", chunks: req(strings.Repeat("ms p 1 q\r\n1\r\nma p q\r\nmg p v O1\r\nmg z v q\r\n", 20) + "mn\r\n")},
	// Pipelined reads, which the proxy fetches ahead of their turn.
	{name: "pipelined mg of many keys, hits and quiet misses", chunks: req(pipelinedMetaReads())},
	{name: "pipelined mg with a write between", chunks: req("ms a 1\r\n1\r\nmg a v\r\nmg b v q\r\nms a 1\r\n2\r\nmg a v\r\nmg a v k\r\nmd a q\r\nmg a v\r\nmn\r\n")},
	{name: "pipelined mg of a stale item twice", chunks: req("ms a 1\r\nx\r\nms b 1\r\ny\r\nmd a I\r\nmg a v\r\nmg b v\r\nmg a v\r\nmg b v\r\nmn\r\n")},
	{name: "pipelined mg with a refused line between", chunks: req("ms a 1\r\nx\r\nmg a v\r\nmg\r\nmg a v Zz\r\nmg a v O123 k\r\nmn\r\n")},
	{name: "pipelined mg with touches and vivify", chunks: req("ms a 1\r\nx\r\nmg a v\r\nmg a v T30 t\r\nmg a t v\r\nmg n v N30\r\nmg n v\r\nmn\r\n")},
}

// metaSeparately are meta cases where the proxy differs from memcached on
// purpose: it consumes the data block of every refused ms whose length it
// read (memcached leaves it to be read as a command when the key is too
// long or there are too many flags).
var metaSeparately = []diffCase{
	{name: "ms with 251-byte key consumes the block", chunks: req("ms " + key251 + " 1\r\nv\r\nmg a v\r\n"),
		proxyWant: "CLIENT_ERROR bad command line format\r\nEN\r\n"},
	{name: "ms with too many flags consumes the block", chunks: req("ms foo 1 " + metaFlags1 + "\r\nv\r\nmn\r\n"),
		proxyWant: "CLIENT_ERROR options flags too long\r\nMN\r\n"},
}

// metaKeyspaceWant are the replies that differ with key settings on: a
// 251-byte key is served, and a base64 key is checked once decoded.
var metaKeyspaceWant = map[string]string{
	"mg with 251-byte key":                    "EN\r\n",
	"mg base64 key of 248 and 252 bytes":      "EN k" + b64key248 + " b\r\nEN\r\n",
	"me of a missing key and without key":     "EN\r\n" + strings.Repeat("CLIENT_ERROR bad command line format\r\n", 3) + "EN\r\n",
	"ms with 251-byte key consumes the block": "HD\r\nEN\r\n",
}

// metaEnvelopeWant are the replies that differ when values are enveloped:
// me describes the item memcached holds, whose size is the envelope's.
var metaEnvelopeWant = map[string]string{}

func TestMetaDifferential(t *testing.T) {
	if len(metaDiffCases) < 40 {
		t.Fatalf("only %d meta differential cases", len(metaDiffCases))
	}
	runDifferential(t, slices.Concat(metaDiffCases, metaSeparately), 1, testConfig, nil)
}

// TestMetaDifferentialEnvelopeAll runs the meta cases through a proxy that
// envelopes every value: the client must see memcached's bytes all the
// same.
func TestMetaDifferentialEnvelopeAll(t *testing.T) {
	cases := slices.DeleteFunc(slices.Clone(metaDiffCases), func(tc diffCase) bool {
		return tc.name == "me of an item" // the stored size is the envelope's
	})
	runDifferential(t, cases, 1, envelopeAllConfig, metaEnvelopeWant)
}

// TestMetaDifferentialKeyspace runs the meta cases with key settings on.
func TestMetaDifferentialKeyspace(t *testing.T) {
	runDifferential(t, slices.Concat(metaDiffCases, metaSeparately), 1, keyspaceConfig, metaKeyspaceWant)
}

// TestMetaDifferentialThreeServers runs the meta cases through a proxy
// that spreads keys over three servers, values plain and enveloped; cases
// that name CAS values are left out (each server counts its own).
func TestMetaDifferentialThreeServers(t *testing.T) {
	t.Run("plain", func(t *testing.T) {
		runDifferential(t, slices.Concat(metaDiffCases, metaSeparately), 3, testConfig, nil)
	})
	t.Run("enveloped", func(t *testing.T) {
		runDifferential(t, metaDiffCases, 3, envelopeAllConfig, metaEnvelopeWant)
	})
}

// pipelinedMetaReads is a client of the meta protocol at work: 70 items
// stored, then, in one write, mg lines for 100 keys (every tenth a miss,
// quiet or not) with assorted flags, and an mn.
func pipelinedMetaReads() string {
	var b strings.Builder
	for i := range 70 {
		fmt.Fprintf(&b, "ms p%d %d F%d T0 q\r\n%s\r\n", i, len(itoa(i)), i, itoa(i))
	}
	flags := []string{"v", "v f", "v t q", "s f k", "v O42 q", "k v", "v q"}
	for i := range 100 {
		key := "p" + itoa(i)
		if i%10 == 9 {
			key = "missing" + itoa(i)
		}
		fmt.Fprintf(&b, "mg %s %s\r\n", key, flags[i%len(flags)])
	}
	b.WriteString("mn\r\n")
	return b.String()
}

// TestMetaPipelinedReadsGoTogether checks that mg lines a client pipelines
// are fetched together, not one round trip each, and answered in order.
func TestMetaPipelinedReadsGoTogether(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, testConfig(up))
	lc := newLineClient(t, addr)
	const n = 64
	var req, want strings.Builder
	for i := range n {
		v := itoa(i)
		if r := lc.do(fmt.Sprintf("ms r%d %d\r\n%s\r\n", i, len(v), v)); r != "HD\r\n" {
			t.Fatalf("ms: %q", r)
		}
		fmt.Fprintf(&req, "mg r%d v k\r\n", i)
		fmt.Fprintf(&want, "VA %d kr%d\r\n%s\r\n", len(v), i, v)
	}
	req.WriteString("mn\r\n")
	want.WriteString("MN\r\n")
	srv := p.upstreams().Servers[0]
	before := srv.Requests()
	exchangeExact(t, lc, req.String(), want.String())
	// They go out together, in the write of the poll that read them, or
	// of the few polls their bytes took to arrive.
	if got := srv.Requests() - before; got > 8 {
		t.Errorf("%d upstream batches for %d pipelined mg, want at most 8", got, n)
	}
}

// exchangeExact sends req in one write and checks that the replies are
// want, byte for byte, read within 10 s.
func exchangeExact(t *testing.T, lc *lineClient, req, want string) {
	t.Helper()
	lc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(lc.c, req); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(lc.br, got); err != nil {
		t.Fatalf("reading the replies: %v (read %q)", err, short(string(got)))
	}
	if string(got) != want {
		t.Fatalf("replies\n%q\nwant\n%q", short(string(got)), short(want))
	}
}
