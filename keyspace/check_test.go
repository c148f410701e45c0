package keyspace

import (
	"bytes"
	"strings"
	"testing"
)

func TestCheckAcceptsWhatMemcachedAccepts(t *testing.T) {
	k := newKeyspace(t, nil)
	cases := []struct {
		name   string
		key    string
		reason Reason
	}{
		{"short printable key", "foo", ReasonOK},
		{"key of the client maximum", strings.Repeat("k", 65536), ReasonOK},
		{"control bytes other than CR LF NUL", "a\x01\t\x1b\x7fb", ReasonOK},
		{"bytes above 0x7f", "k\x80\xff", ReasonOK},
		{"the marker", "~", ReasonOK},
		{"empty key", "", ReasonEmpty},
		{"one byte over the client maximum", strings.Repeat("k", 65537), ReasonTooLong},
		{"space", "a b", ReasonBadByte},
		{"carriage return", "a\rb", ReasonBadByte},
		{"line feed", "a\nb", ReasonBadByte},
		{"NUL", "a\x00b", ReasonBadByte},
		{"NUL deep in a long key", strings.Repeat("k", 1000) + "\x00", ReasonBadByte},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason := k.Check([]byte(tc.key))
			if ok != (tc.reason == ReasonOK) || reason != tc.reason {
				t.Errorf("Check = %v, %v; want %v", ok, reason, tc.reason)
			}
		})
	}
}

func TestCheckHonoursARaisedClientMaximum(t *testing.T) {
	k := newKeyspace(t, func(c *Config) { c.MaxClientLength = 8000 })
	if ok, _ := k.Check([]byte(strings.Repeat("k", 8000))); !ok {
		t.Error("8000-byte key refused under an 8000-byte maximum")
	}
	if _, r := k.Check([]byte(strings.Repeat("k", 8001))); r != ReasonTooLong {
		t.Errorf("8001-byte key: reason %v", r)
	}
}

func TestNeedsRewriteOnlyForKeysTheUpstreamCannotCarry(t *testing.T) {
	k := newKeyspace(t, nil)
	cases := []struct {
		name string
		key  string
		want bool
	}{
		{"short printable key", "P2:tenant:" + blockA + ":am9i", false},
		{"exactly 250 bytes", strings.Repeat("k", 250), false},
		{"bytes above 0x7f", "k\x80\xff", false},
		{"marker inside the key", "a~b", false},
		{"251 bytes", strings.Repeat("k", 251), true},
		{"tab", "a\tb", true},
		{"escape", "a\x1bb", true},
		{"DEL", "a\x7fb", true},
		{"control byte after the first word", strings.Repeat("k", 17) + "\x01", true},
		{"starts with the marker", "~a", false},
		{"empty key", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := k.NeedsRewrite([]byte(tc.key)); got != tc.want {
				t.Errorf("NeedsRewrite = %v, want %v", got, tc.want)
			}
		})
	}
}

// The word-at-a-time scans must agree with the plain byte loops they
// replace, for every byte value at every position of a word and its tail.
func TestWordScansAgreeWithByteLoops(t *testing.T) {
	k := newKeyspace(t, nil)
	naiveBad := func(b []byte) bool {
		for _, c := range b {
			if c == ' ' || c == '\r' || c == '\n' || c == 0 {
				return true
			}
		}
		return false
	}
	naiveIllegal := func(b []byte) bool {
		for _, c := range b {
			if c <= ' ' || c == 0x7f {
				return true
			}
		}
		return false
	}
	naiveKeepable := func(b []byte) bool { return !naiveIllegal(b) && !strings.Contains(string(b), "~") }
	for _, fill := range []byte{'a', 0x80, 0xff, '!', '}'} {
		for n := 1; n <= 25; n++ {
			for pos := 0; pos < n; pos++ {
				for c := 0; c < 256; c++ {
					b := bytes.Repeat([]byte{fill}, n)
					b[pos] = byte(c)
					r, rewrite := k.Inspect(b)
					bad := r == ReasonBadByte
					if bad != naiveBad(b) || !bad && rewrite != naiveIllegal(b) || hasIllegal(b) != naiveIllegal(b) || keepable(b) != naiveKeepable(b) {
						t.Fatalf("scans disagree on %q", b)
					}
				}
			}
		}
	}
}

// TestCheckBinaryTakesAnyBytes checks a decoded base64 meta key: any
// bytes, only its length refused.
func TestCheckBinaryTakesAnyBytes(t *testing.T) {
	k := newKeyspace(t, nil)
	for _, tc := range []struct {
		key    string
		reason Reason
	}{
		{"a b\r\n\x00\x01\xff", ReasonOK},
		{strings.Repeat("\x00", 65536), ReasonOK},
		{"", ReasonEmpty},
		{strings.Repeat(" ", 65537), ReasonTooLong},
	} {
		if ok, reason := k.CheckBinary([]byte(tc.key)); ok != (tc.reason == ReasonOK) || reason != tc.reason {
			t.Errorf("CheckBinary(%.20q) = %v, %v; want %v", tc.key, ok, reason, tc.reason)
		}
	}
}
