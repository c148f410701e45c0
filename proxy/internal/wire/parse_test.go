package wire

import (
	"bytes"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// manyKeys returns n keys separated by single spaces.
func manyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	return strings.Join(keys, " ")
}

func TestTokenizeSplitsLikeMemcached(t *testing.T) {
	cases := []struct {
		name     string
		line     string
		limit    int
		want     []string
		overflow bool
	}{
		{name: "empty line has no words", line: "", limit: 4},
		{name: "line of spaces has no words", line: "    ", limit: 4},
		{name: "single space separates words", line: "get a b", limit: 4, want: []string{"get", "a", "b"}},
		{name: "runs of spaces count as one separator", line: "get   a  b", limit: 4, want: []string{"get", "a", "b"}},
		{name: "leading and trailing spaces are dropped", line: "  get a  ", limit: 4, want: []string{"get", "a"}},
		{name: "tab belongs to the word", line: "set\ta 0", limit: 4, want: []string{"set\ta", "0"}},
		{name: "carriage return and other control bytes belong to the word", line: "a\rb \v\f \x00", limit: 4, want: []string{"a\rb", "\v\f", "\x00"}},
		{name: "non-ASCII bytes belong to the word", line: "k\xff\x80 v", limit: 4, want: []string{"k\xff\x80", "v"}},
		{name: "exactly limit words is no overflow", line: "a b c", limit: 3, want: []string{"a", "b", "c"}},
		{name: "spaces after the last allowed word are no overflow", line: "a b c   ", limit: 3, want: []string{"a", "b", "c"}},
		{name: "one word past the limit overflows", line: "a b c d", limit: 3, want: []string{"a", "b", "c"}, overflow: true},
		{name: "many words past the limit keep the first limit", line: "a b c d e f g", limit: 3, want: []string{"a", "b", "c"}, overflow: true},
		{name: "zero limit overflows on the first word", line: "a", limit: 0, overflow: true},
		{name: "zero limit on a blank line is no overflow", line: "  ", limit: 0},
		{name: "memcached's 23 words plus one overflows", line: manyKeys(24), limit: MaxTokens - 1, want: strings.Fields(manyKeys(23)), overflow: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			words, overflow := Tokenize(nil, []byte(tc.line), tc.limit)
			got := make([]string, len(words))
			for i, w := range words {
				got[i] = string(w)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("words = %q, want %q", got, tc.want)
			}
			if overflow != tc.overflow {
				t.Errorf("overflow = %v, want %v", overflow, tc.overflow)
			}
		})
	}
}

func TestTokenizeSlicesTheLineWithoutCopying(t *testing.T) {
	line := []byte(" get  key1 key2 ")
	dst := make([][]byte, 0, MaxTokens)
	words, _ := Tokenize(dst, line, MaxTokens-1)
	for _, w := range words {
		i := bytes.Index(line, w)
		if &w[0] != &line[i] {
			t.Errorf("word %q is a copy, not a slice of the line", w)
		}
	}
	if &words[:1][0] != &dst[:1][0] {
		t.Error("words were not stored in dst")
	}
	allocs := testing.AllocsPerRun(100, func() { Tokenize(dst, line, MaxTokens-1) })
	if allocs != 0 {
		t.Errorf("tokenize allocated %v times with room in dst", allocs)
	}
}

type numberCase struct {
	name          string
	in            string
	u64, u32, i32 string // results of parseUint64, parseUint32, parseInt32
}

// refused is the expected result of a number the parser must reject.
const refused = "refused"

// numberCases give, for one word, what memcached's safe_strtoull,
// safe_strtoul and safe_strtol make of it on a 64-bit build (several were
// checked against memcached 1.6.18 through flags, exptime and length
// fields).
var numberCases = []numberCase{
	{name: "empty word is refused", in: "", u64: refused, u32: refused, i32: refused},
	{name: "lone minus sign is refused", in: "-", u64: refused, u32: refused, i32: refused},
	{name: "lone plus sign is refused", in: "+", u64: refused, u32: refused, i32: refused},
	{name: "white space alone is refused", in: " \t", u64: refused, u32: refused, i32: refused},
	{name: "zero", in: "0", u64: "0", u32: "0", i32: "0"},
	{name: "plus sign is accepted", in: "+5", u64: "5", u32: "5", i32: "5"},
	{name: "minus zero is zero", in: "-0", u64: "0", u32: "0", i32: "0"},
	{name: "minus one reads negative so only the signed parser takes it", in: "-1", u64: refused, u32: refused, i32: "-1"},
	{name: "minus five likewise", in: "-5", u64: refused, u32: refused, i32: "-5"},
	{name: "leading zeros do not overflow", in: "000000000000000000000000000042", u64: "42", u32: "42", i32: "42"},
	{name: "largest uint32", in: "4294967295", u64: "4294967295", u32: "4294967295", i32: "-1"},
	{name: "2^32 wraps to zero in 32 bits", in: "4294967296", u64: "4294967296", u32: "0", i32: "0"},
	{name: "2^31 wraps negative as int32", in: "2147483648", u64: "2147483648", u32: "2147483648", i32: "-2147483648"},
	{name: "below int32 range wraps positive", in: "-2147483649", u64: refused, u32: refused, i32: "2147483647"},
	{name: "minus 2^32 truncates to zero as int32", in: "-4294967296", u64: refused, u32: refused, i32: "0"},
	{name: "largest int64", in: "9223372036854775807", u64: "9223372036854775807", u32: "4294967295", i32: "-1"},
	{name: "2^63 is out of strtol's range", in: "9223372036854775808", u64: "9223372036854775808", u32: "0", i32: refused},
	{name: "largest uint64", in: "18446744073709551615", u64: "18446744073709551615", u32: "4294967295", i32: refused},
	{name: "2^64 overflows everything", in: "18446744073709551616", u64: refused, u32: refused, i32: refused},
	{name: "far too many digits overflow", in: "99999999999999999999999", u64: refused, u32: refused, i32: refused},
	{name: "smallest int64 is strtol's and truncates to zero", in: "-9223372036854775808", u64: refused, u32: refused, i32: "0"},
	{name: "below int64 strtoull wraps to a positive value", in: "-9223372036854775809", u64: "9223372036854775807", u32: "4294967295", i32: refused},
	{name: "minus 2^64-1 wraps to one for strtoull", in: "-18446744073709551615", u64: "1", u32: "1", i32: refused},
	{name: "minus 2^64 overflows", in: "-18446744073709551616", u64: refused, u32: refused, i32: refused},
	{name: "leading tab is skipped", in: "\t5", u64: "5", u32: "5", i32: "5"},
	{name: "leading space is skipped", in: " 5", u64: "5", u32: "5", i32: "5"},
	{name: "every C white space byte is skipped", in: "\n\v\f\r \t5", u64: "5", u32: "5", i32: "5"},
	{name: "white space before the sign is skipped", in: "\t-7", u64: refused, u32: refused, i32: "-7"},
	{name: "trailing tab is allowed", in: "5\t", u64: "5", u32: "5", i32: "5"},
	{name: "trailing space is allowed", in: "5 ", u64: "5", u32: "5", i32: "5"},
	{name: "only the byte after the digits must be white space", in: "5\tx", u64: "5", u32: "5", i32: "5"},
	{name: "a minus after a small number is ignored", in: "5\t-", u64: "5", u32: "5", i32: "5"},
	// safe_strtoull and safe_strtoul look for '-' with strchr over the whole
	// word, not only at the sign: memcached 1.6.18 answers
	// "incr n 18446744073709551615\t-" with CLIENT_ERROR invalid numeric
	// delta argument.
	{name: "a minus anywhere in the word refuses a value that reads negative", in: "18446744073709551615\t-", u64: refused, u32: refused, i32: refused},
	{name: "a minus after 2^63 refuses it in 32 bits too", in: "9223372036854775808\v-", u64: refused, u32: refused, i32: refused},
	{name: "letter after digits is refused", in: "5x", u64: refused, u32: refused, i32: refused},
	{name: "minus after digits is refused", in: "5-", u64: refused, u32: refused, i32: refused},
	{name: "letter before digits is refused", in: "x5", u64: refused, u32: refused, i32: refused},
	{name: "hexadecimal is refused", in: "0x10", u64: refused, u32: refused, i32: refused},
	{name: "exponent is refused", in: "1e3", u64: refused, u32: refused, i32: refused},
	{name: "space between sign and digits is refused", in: "- 5", u64: refused, u32: refused, i32: refused},
	{name: "two signs are refused", in: "+-5", u64: refused, u32: refused, i32: refused},
	{name: "double minus is refused", in: "--5", u64: refused, u32: refused, i32: refused},
	{name: "non-breaking space is not C white space", in: "\xa05", u64: refused, u32: refused, i32: refused},
	{name: "next-line byte after digits is not C white space", in: "5\x85", u64: refused, u32: refused, i32: refused},
	{name: "overflow is refused even with trailing junk", in: "99999999999999999999x", u64: refused, u32: refused, i32: refused},
}

func TestParseNumbersLikeMemcached(t *testing.T) {
	for _, tc := range numberCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range parseResults([]byte(tc.in)) {
				if want := tc.want(r.parser); r.got != want {
					t.Errorf("%s(%q) = %s, want %s", r.parser, tc.in, r.got, want)
				}
			}
		})
	}
}

func TestNumberCasesAgreeWithReference(t *testing.T) {
	// The reference must itself reproduce the hand-written table, or the
	// fuzz target below would be comparing against the wrong thing.
	for _, tc := range numberCases {
		for _, r := range parseResults([]byte(tc.in)) {
			if want := tc.want(r.parser); r.memcached != want {
				t.Errorf("%s: reference for %s(%q) = %s, table says %s", tc.name, r.parser, tc.in, r.memcached, want)
			}
		}
	}
}

// FuzzNumbers compares the parsers with a reference model of memcached's
// safe_strto* written from the C library's definition, on big integers.
func FuzzNumbers(f *testing.F) {
	for _, tc := range numberCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.IndexByte(s, 0) >= 0 {
			// A C string ends at NUL, and the reader cuts every line at its
			// first NUL, so no word reaching the parsers holds one.
			t.Skip()
		}
		for _, r := range parseResults([]byte(s)) {
			if r.got != r.memcached {
				t.Errorf("%s(%q) = %s, memcached makes it %s", r.parser, s, r.got, r.memcached)
			}
		}
	})
}

// parseResult is what one parser and its memcached counterpart make of a
// word, formatted as a number or refused.
type parseResult struct{ parser, got, memcached string }

func parseResults(in []byte) []parseResult {
	s := string(in)
	return []parseResult{
		{"parseUint64", outcome64(ParseUint64(in)), outcome64(cStrtoull(s))},
		{"parseUint32", outcome32(ParseUint32(in)), outcome32(cStrtoul(s))},
		{"parseInt32", outcomeInt32(ParseInt32(in)), outcomeInt32(cStrtol(s))},
	}
}

// want returns the table's expectation for parser.
func (tc numberCase) want(parser string) string {
	switch parser {
	case "parseUint64":
		return tc.u64
	case "parseUint32":
		return tc.u32
	}
	return tc.i32
}

func outcome64(v uint64, ok bool) string {
	if !ok {
		return refused
	}
	return strconv.FormatUint(v, 10)
}

func outcome32(v uint32, ok bool) string { return outcome64(uint64(v), ok) }

func outcomeInt32(v int32, ok bool) string {
	if !ok {
		return refused
	}
	return strconv.FormatInt(int64(v), 10)
}

// cWhiteSpace is isspace() in the C locale.
const cWhiteSpace = " \t\n\v\f\r"

// cNumber is what C's strto* functions see in base 10: the sign, the
// magnitude of the digits, and what follows them. ok is false when no digit
// was read, in which case strto* set endptr to the start of the string.
type cNumber struct {
	negative  bool
	magnitude *big.Int
	rest      string
	ok        bool
}

func scanCNumber(s string) cNumber {
	body := strings.TrimLeft(s, cWhiteSpace)
	var n cNumber
	if body != "" && (body[0] == '+' || body[0] == '-') {
		n.negative = body[0] == '-'
		body = body[1:]
	}
	end := strings.IndexFunc(body, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(body)
	}
	if end == 0 {
		return cNumber{}
	}
	n.magnitude, _ = new(big.Int).SetString(body[:end], 10)
	n.rest = body[end:]
	n.ok = true
	return n
}

// endsWell is memcached's check on endptr: the number ends the word or is
// followed by white space.
func (n cNumber) endsWell() bool {
	return n.rest == "" || strings.IndexByte(cWhiteSpace, n.rest[0]) >= 0
}

var (
	two64    = new(big.Int).Lsh(big.NewInt(1), 64)
	maxUint  = new(big.Int).Sub(two64, big.NewInt(1))
	minInt64 = new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 63))
	maxInt64 = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 63), big.NewInt(1))
)

// cStrtoull is memcached's safe_strtoull over glibc's strtoull: ERANGE
// above 2^64-1 whatever the sign, a minus sign negating modulo 2^64, and a
// result that reads negative as int64 refused when strchr finds '-'
// anywhere in the string.
func cStrtoull(s string) (uint64, bool) {
	n := scanCNumber(s)
	if !n.ok || n.magnitude.Cmp(maxUint) > 0 || !n.endsWell() {
		return 0, false
	}
	v := new(big.Int).Set(n.magnitude)
	if n.negative {
		v.Neg(v).Mod(v, two64)
	}
	u := v.Uint64()
	if int64(u) < 0 && strings.Contains(s, "-") {
		return 0, false
	}
	return u, true
}

// cStrtoul is memcached's safe_strtoul on a 64-bit build, where unsigned
// long is 64 bits wide: safe_strtoull's checks, then the assignment to a
// uint32_t keeps the low 32 bits.
func cStrtoul(s string) (uint32, bool) {
	v, ok := cStrtoull(s)
	return uint32(v), ok
}

// cStrtol is memcached's safe_strtol on a 64-bit build: glibc's strtol
// reports ERANGE outside int64, and the long is assigned to an int32_t.
func cStrtol(s string) (int32, bool) {
	n := scanCNumber(s)
	if !n.ok || !n.endsWell() {
		return 0, false
	}
	v := new(big.Int).Set(n.magnitude)
	if n.negative {
		v.Neg(v)
	}
	if v.Cmp(minInt64) < 0 || v.Cmp(maxInt64) > 0 {
		return 0, false
	}
	return int32(v.Int64()), true
}

// FuzzTokenize holds Tokenize to its definition: the runs of bytes other
// than a space, the first limit of them, and overflow when there are more.
func FuzzTokenize(f *testing.F) {
	for _, seed := range []string{"get a b", "  get   a  ", "set\tk 0 0 1", "mg " + manyKeys(30), "P2:" + strings.Repeat("t", 150) + ":01K9WV71R0KRHMF7XDGJH23WFB:x y", ""} {
		f.Add(seed, uint8(MaxTokens-1))
	}
	f.Fuzz(func(t *testing.T, line string, limit uint8) {
		all := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' })
		want, wantOverflow := all, false
		if len(all) > int(limit) {
			want, wantOverflow = all[:limit], true
		}
		words, overflow := Tokenize(nil, []byte(line), int(limit))
		got := make([]string, len(words))
		for i, w := range words {
			got[i] = string(w)
		}
		if !slices.Equal(got, want) || overflow != wantOverflow {
			t.Fatalf("Tokenize(%q, %d) = %q, %v; want %q, %v", line, limit, got, overflow, want, wantOverflow)
		}
	})
}
