package codec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt from the current encoder (only with a new format version)")

const goldenFile = "testdata/golden.txt"

// goldenCases are the inputs of the golden vectors: every codec, bound and
// unbound, and the flags values that exercise the reserved bit.
func goldenCases() []fixture {
	return []fixture{
		{"empty-value", []byte("k"), false, 0, nil},
		{"short-plain", testKey, false, 0, []byte("hello")},
		{"all-flags", testKey, false, math.MaxUint32, []byte("hello")},
		{"reserved-flag-only", testKey, false, 1 << DefaultFlagBit, []byte("hello")},
		{"bound-key", rewrittenKey, true, 42, []byte("hello")},
		{"snappy-repetitive", testKey, false, 0, bytes.Repeat([]byte("postings "), 20)},
		{"snappy-series", testKey, false, 7, seriesPayload(400, 11)},
		{"snappy-series-bound", rewrittenKey, true, 0x80000001, seriesPayload(400, 12)},
		{"mimir-dm-as-is", testKey, false, 0, mimirPostingsPayload(80, 13)},
		{"gzip-as-is", testKey, false, 0, append([]byte{0x1f, 0x8b, 0x08, 0}, bytes.Repeat([]byte{'z'}, 80)...)},
		{"raw-postings-as-is", testKey, false, 0, postingsPayload(120, 14)},
		// Encoded with AppendEncodePostings, as under a postings-bearing
		// key (the "postings-" prefix says so): the postings codec in
		// each layout, its stream raw and snappy-compressed, and values
		// that are no list, which must be stored as by AppendEncode.
		{"postings-tsdb", testKey, false, 0, append(binary.BigEndian.AppendUint32(nil, 30), postingsPayload(120, 15)...)},
		{"postings-u32-runs", testKey, false, 3, postingsRuns(800, 16)},
		{"postings-u32-bound", rewrittenKey, true, 1 << DefaultFlagBit, postingsPayload(200, 17)},
		{"postings-u64", testKey, false, 0, u64Postings(10, 18)},
		{"postings-consecutive-snappy", testKey, false, 0, consecutive(1000)},
		{"postings-sparse", testKey, false, 0, sparseList(400, 19)},
		{"postings-u32-codec2-where-packing-loses", testKey, false, 0, alternatingGaps(100)},
		{"postings-not-a-list", testKey, false, 7, seriesPayload(400, 11)},
		{"postings-not-ascending-snappy", testKey, false, 0, bytes.Repeat([]byte{0, 0, 1, 0, 0, 0, 0, 1}, 10)},
	}
}

// alternatingGaps is a list of n references whose gaps alternate between 1
// and 2^20: bit-packed, half of them are exceptions, and the uvarint stream
// of codec 2 is shorter.
func alternatingGaps(n int) []byte {
	refs := make([]uint32, n)
	for i := 1; i < n; i++ {
		refs[i] = refs[i-1] + 1 + uint32(i%2)*(1<<20-1)
	}
	return u32s(refs...)
}

// goldenEncode encodes a golden case as the proxy would: "postings-" cases
// under a postings-bearing key.
func goldenEncode(c *Codec, name string, key []byte, bind bool, flags uint32, value []byte) ([]byte, uint32) {
	if strings.HasPrefix(name, "postings-") {
		return c.AppendEncodePostings(nil, key, bind, flags, value)
	}
	return c.AppendEncode(nil, key, bind, flags, value)
}

func hexOrDash(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	return hex.EncodeToString(b)
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	if s == "-" {
		return nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGoldenVectors pins the envelope format: the encoder must reproduce
// every stored vector byte for byte and the decoder must read each back.
// Both inputs and outputs live in the file, so the decoder half keeps
// testing the format even if the generators above change.
func TestGoldenVectors(t *testing.T) {
	c := newTestCodec(t, nil)
	if *update {
		var b strings.Builder
		b.WriteString("# Envelope format version 1 golden vectors (codec defaults: flag bit 30, min size 64, min savings 0.1).\n")
		b.WriteString("# Regenerate with `go test ./codec -run TestGoldenVectors -update` only together with a new format version.\n")
		b.WriteString("# name key-hex bind client-flags value-hex stored-flags stored-hex\n")
		for _, g := range goldenCases() {
			stored, sf := goldenEncode(c, g.name, g.key, g.bind, g.flags, g.value)
			fmt.Fprintf(&b, "%s %s %v %d %s %#08x %s\n", g.name, hexOrDash(g.key), g.bind, g.flags, hexOrDash(g.value), sf, hexOrDash(stored))
		}
		if err := os.WriteFile(goldenFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inputs := map[string]fixture{}
	for _, g := range goldenCases() {
		inputs[g.name] = g
	}
	seen := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 7 {
			t.Fatalf("bad golden line %q", line)
		}
		name := fields[0]
		key, value, stored := unhex(t, fields[1]), unhex(t, fields[4]), unhex(t, fields[6])
		bind := fields[2] == "true"
		flags, err1 := strconv.ParseUint(fields[3], 10, 32)
		sf, err2 := strconv.ParseUint(fields[5], 0, 32)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad golden line %q", line)
		}
		t.Run(name, func(t *testing.T) {
			got, gotSF := goldenEncode(c, name, key, bind, uint32(flags), value)
			if !bytes.Equal(got, stored) || gotSF != uint32(sf) {
				t.Fatalf("encoder changed the format:\n got %#08x %x\nwant %#08x %x", gotSF, got, sf, stored)
			}
			mustDecodeTo(t, c, key, bind, uint32(sf), stored, value, uint32(flags))
			if in, ok := inputs[name]; ok && (!bytes.Equal(in.key, key) || !bytes.Equal(in.value, value) || in.flags != uint32(flags) || in.bind != bind) {
				t.Fatalf("golden input %s no longer matches its generator", name)
			}
		})
		seen++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(inputs) {
		t.Fatalf("%d golden vectors, want %d", seen, len(inputs))
	}
}

// TestHandCheckedVector spells one envelope out byte by byte, as the
// package doc describes it, independently of the encoder.
func TestHandCheckedVector(t *testing.T) {
	c := newTestCodec(t, nil)
	stored, sf := c.AppendEncode(nil, []byte("k"), false, 1, []byte("hi"))
	// CRC-32C over: client flags 01 00 00 00, key "k", header 0x40, then
	// length 02 and "hi".
	in := []byte{1, 0, 0, 0, 'k', 0x40, 2, 'h', 'i'}
	crc := crc32c(in)
	want := []byte{0x40, byte(crc), byte(crc >> 8), byte(crc >> 16), byte(crc >> 24), 2, 'h', 'i'}
	if !bytes.Equal(stored, want) || sf != 0x40000001 {
		t.Fatalf("got %#08x % x, want 0x40000001 % x", sf, stored, want)
	}
}

// codec2File holds postings entries as the encoder wrote them before codec
// 3 existed: items already in caches. It is never regenerated.
const codec2File = "testdata/postings-codec2.txt"

// TestCodec2EntriesStillDecode reads postings entries written by the
// codec-2 encoder (every layout, raw and snappy streams, bound and not) and
// checks that each still decodes to the client's exact bytes and flags,
// whatever the encoder writes today.
func TestCodec2EntriesStillDecode(t *testing.T) {
	c := newTestCodec(t, nil)
	data, err := os.ReadFile(codec2File)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 7 {
			t.Fatalf("bad line %.60q", line)
		}
		name := fields[0]
		key, value, stored := unhex(t, fields[1]), unhex(t, fields[4]), unhex(t, fields[6])
		bind := fields[2] == "true"
		flags, err1 := strconv.ParseUint(fields[3], 10, 32)
		sf, err2 := strconv.ParseUint(fields[5], 0, 32)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad line %.60q", line)
		}
		t.Run(name, func(t *testing.T) {
			if codecOf(stored) != CodecPostings {
				t.Fatalf("entry of codec %d, want %d", codecOf(stored), CodecPostings)
			}
			mustDecodeTo(t, c, key, bind, uint32(sf), stored, value, uint32(flags))
		})
		seen++
	}
	if seen < 10 {
		t.Fatalf("%d codec-2 entries, want at least 10", seen)
	}
}
