package proxy

import (
	"regexp"
	"strings"
	"testing"
)

// TestEventLoopAnswersMetaItself: ms, md, mg and me are answered on the
// loop, byte for byte as memcached answers them: every mode, CAS values
// that match and that do not, quiet requests (whose HD is not written),
// opaque tokens and returned keys in the client's order, base64 keys,
// refused flags, keys and data blocks, a value over the item size, and
// a block that arrives in pieces.
func TestEventLoopAnswersMetaItself(t *testing.T) {
	// One memcached answers directly, another through the sidecar: each
	// run begins with the same, empty, cache.
	mc, behind := startMemcached(t), startMemcached(t)
	_, addr := startProxy(t, loopConfig(behind))
	long := strings.Repeat("k", 251)
	big := strings.Repeat("x", 1<<20+1)
	for _, chunks := range [][]string{
		{"ms m1 2\r\nhi\r\n", "ms m1 2 T0 F5 c k O123\r\nho\r\n", "mg m1 v f\r\n"},
		{"ms m2 1 ME\r\na\r\n", "ms m2 1 ME k Oabc\r\nb\r\n", "ms m2 2 MA\r\nbc\r\n", "ms m2 2 MP q\r\nzz\r\n", "mn\r\n", "mg m2 v\r\n"},
		{"ms m3 1 MR\r\na\r\n", "ms m3 1 MA\r\na\r\n", "ms m3 1 MP\r\na\r\n", "ms m3 1 MS I\r\nv\r\n"},
		{"ms m4 1 c\r\nv\r\n", "ms m4 1 C1\r\nw\r\n", "md m4 C1 q O9 k\r\n", "md m4 q\r\n", "md m4 k O1\r\n", "mn\r\n"},
		{"ms bTU= 1 b k c\r\nv\r\n", "mg bTU= b v k\r\n", "md bTU= b k\r\n", "md bTU= b\r\n"},
		{"ms m6 1 MX\r\nv\r\n", "ms m6 1 Z\r\nv\r\n", "ms m6 1 T1 T2\r\nv\r\n", "ms m6 x\r\n", "ms m6\r\n", "md m6 Cx\r\n", "md m6 MZ\r\n", "md\r\n"},
		{"md " + long + "\r\n", "ms m7 3\r\nabcde\r\n", "mn\r\n"},
		{"ms m8 " + "1048577" + " T0\r\n" + big + "\r\n", "mg m8 v\r\n"},
		{"ms m9 10 O5", " k\r\n01234", "56789\r", "\n", "mg m9 v\r\n"},
		{"md m10 I T30\r\n", "ms m10 1\r\nv\r\n", "md m10 I T30\r\n", "mg m10 v c\r\n", "ms m10 1 I\r\nw\r\n"},
		// ma: every mode, quiet, created with N, CAS, refusals.
		{"ma a1\r\n", "ma a1 N0 J10 v\r\n", "ma a1 v t c k O4\r\n", "ma a1 MD D3 v\r\n", "ma a1 q\r\nma a1 q v\r\nmn\r\n", "mg a1 v\r\n"},
		{"ma a2 q N0 J5\r\n", "ma a2 q N0 J5\r\nmn\r\n", "ma a2 C1 v\r\n", "ma a2 MX\r\n", "ma a2 Dx\r\n", "ma a2 Jx\r\n", "ma\r\n", "ma " + long + "\r\n"},
		{"ms a3 2\r\nab\r\n", "ma a3\r\n", "ms a4 20\r\n18446744073709551615\r\n", "ma a4 v\r\n", "ma a4 MD D5 v T30 t\r\n", "ma bTU= b N0 v k\r\n"},
		// mg: hits and misses with every kind of flag, quiet, pipelined.
		{"ms g1 3 F9 T100\r\nabc\r\n", "mg g1 s v f t k O77 q\r\nmg g2 v q\r\nmg g2 k Oz\r\nmn\r\n", "mg g1\r\n", "mg g1 h l\r\n"},
		{"mg g3 N30 v c s t\r\n", "mg g3 v\r\n", "mg g3 T0 t\r\n", "mg g3 R30 v t\r\n", "mg g3 E\r\n", "mg g3 u v\r\n"},
		{"ms e1 3\r\nabc\r\n", "me e1\r\nme e2\r\n", "me\r\n", "me " + long + "\r\n", "ms bTU= 1 b\r\nv\r\n", "me bTU= b\r\n", "me e1 x y\r\nmn\r\n"},
		{"mg\r\n", "mg " + long + " v\r\n", "mg g4 v v\r\n", "mg g4 Tx\r\n", "mg g4 !\r\n", "mg bTU= b k v\r\n", "mg ==== b\r\n"},
	} {
		// CAS values and the seconds since the last access may differ.
		cas := regexp.MustCompile(` (c[1-9]\d*|la=\d+)`)
		want := cas.ReplaceAllString(exchange(t, mc, chunks...), " N")
		if got := cas.ReplaceAllString(exchange(t, addr, chunks...), " N"); got != want {
			t.Errorf("%.120q:\nproxy     %q\nmemcached %q", chunks, short(got), short(want))
		}
	}
	// Where the sidecar differs on purpose: the data block of an ms
	// refused for its key or flags is dropped, not read as commands.
	const refused = "CLIENT_ERROR bad command line format\r\nCLIENT_ERROR options flags too long\r\nMN\r\n"
	if got := exchange(t, addr, "ms "+long+" 1\r\nv\r\n", "ms a 1 a b c d e f g h i j k l m n o p q r s t\r\nv\r\nmn\r\n"); got != refused {
		t.Errorf("refused ms: %q, want %q", got, refused)
	}
}

// TestEventLoopModifiesEnvelopesItself: with every value enveloped, the
// read-modify-writes (append, prepend, incr, decr, ms in mode A and P, ma,
// and ma creating its item) are answered on the loop as memcached answers
// them, noreply and quiet included.
func TestEventLoopModifiesEnvelopesItself(t *testing.T) {
	mc, behind := startMemcached(t), startMemcached(t)
	cfg := envelopeAllConfig(behind)
	cfg.EventLoops = 1
	p, addr := startProxy(t, cfg)
	for _, chunks := range [][]string{
		{"set n 5 0 2\r\n10\r\n", "append n 0 0 1\r\n0\r\nprepend n 0 0 1\r\n9\r\n", "incr n 5\r\ndecr n 1000\r\n", "get n\r\n", "append z 0 0 1\r\nx\r\nincr z 1\r\n"},
		{"set t 0 0 1\r\nx\r\n", "incr t 1\r\n", "append t 0 0 1 noreply\r\ny\r\nincr n 1 noreply\r\n", "gets t\r\n"},
		{"ms m 2 F3\r\nab\r\n", "ms m 1 MA\r\nc\r\nms m 1 MP k O5\r\nz\r\n", "ms m 1 MA q\r\nd\r\nmn\r\n", "mg m v f\r\n", "ms y 1 MA\r\nv\r\n"},
		{"ma c\r\n", "ma c N0 J7 v t\r\n", "ma c v\r\nma c MD D3 v k O1\r\n", "ma c q\r\nmn\r\n", "ma q1 q N0 J2\r\nmn\r\n", "ma c C1 v\r\n", "mg c v\r\n"},
	} {
		cas := regexp.MustCompile(`(?m)^(VALUE \S+ \d+ \d+) \d+\r$`)
		want := cas.ReplaceAllString(exchange(t, mc, chunks...), "$1 CAS\r")
		if got := cas.ReplaceAllString(exchange(t, addr, chunks...), "$1 CAS\r"); got != want {
			t.Errorf("%.120q:\nproxy     %q\nmemcached %q", chunks, short(got), short(want))
		}
	}
	for _, key := range []string{"n", "t", "m", "c"} {
		if flags, _, ok := rawItem(t, newLineClient(t, behind), key); !ok || !p.codec.IsEnveloped(flags) {
			t.Errorf("%s upstream: flags %d, held %v; want an envelope", key, flags, ok)
		}
	}
}

// TestRequestAfterALocalAnswerWaitsForASerialOne sends a write after a
// quiet ma with N, which takes two round trips (asked without N first),
// with a command the sidecar answers in place between them. The write
// once went upstream between the ma's two trips, as the answer in place
// hid the ma from the check that holds requests back: the ma, asked
// again with N, then found the write's item and incremented it, so
// memcached behind the sidecar held 6 where memcached alone holds 5.
func TestRequestAfterALocalAnswerWaitsForASerialOne(t *testing.T) {
	for _, between := range []string{"foo\r\n", "get\r\n"} {
		direct, up := startMemcached(t), startMemcached(t)
		_, addr := startProxy(t, testConfig(up))
		req := "ma k N0 q\r\n" + between + "set k 0 0 1\r\n5\r\nget k\r\n"
		want, got := exchange(t, direct, req), exchange(t, addr, req)
		if got != want {
			t.Errorf("%q: the sidecar answered %q, memcached %q", req, got, want)
		}
		held, wantHeld := exchange(t, up, "get k\r\n"), exchange(t, direct, "get k\r\n")
		if held != wantHeld {
			t.Errorf("%q: memcached behind the sidecar holds %q, memcached alone %q", req, held, wantHeld)
		}
	}
}
