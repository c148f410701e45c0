package proxy

import (
	"regexp"
	"strings"
	"testing"
)

// TestEventLoopAnswersMetaWritesItself: ms and md are answered on the
// loop, byte for byte as memcached answers them: every mode, CAS values
// that match and that do not, quiet requests (whose HD is not written),
// opaque tokens and returned keys in the client's order, base64 keys,
// refused flags, keys and data blocks, a value over the item size, and
// a block that arrives in pieces.
func TestEventLoopAnswersMetaWritesItself(t *testing.T) {
	// One memcached answers directly, another through the sidecar: each
	// run begins with the same, empty, cache.
	mc, behind := startMemcached(t), startMemcached(t)
	p, addr := startProxy(t, loopConfig(behind))
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
	} {
		cas := regexp.MustCompile(` c[1-9]\d*`)
		want := cas.ReplaceAllString(exchange(t, mc, chunks...), " cN")
		if got := cas.ReplaceAllString(exchange(t, addr, chunks...), " cN"); got != want {
			t.Errorf("%.120q:\nproxy     %q\nmemcached %q", chunks, short(got), short(want))
		}
	}
	// Where the sidecar differs on purpose: the data block of an ms
	// refused for its key or flags is dropped, not read as commands.
	const refused = "CLIENT_ERROR bad command line format\r\nCLIENT_ERROR options flags too long\r\nMN\r\n"
	if got := exchange(t, addr, "ms "+long+" 1\r\nv\r\n", "ms a 1 a b c d e f g h i j k l m n o p q r s t\r\nv\r\nmn\r\n"); got != refused {
		t.Errorf("refused ms: %q, want %q", got, refused)
	}
	if n := loopHandovers(p); n != 6 {
		t.Errorf("%d connections left the loop, want 6 (at mg)", n)
	}
}
