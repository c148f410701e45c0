package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/proxy/memcachedtest"
)

// runLoadgen runs loadgen with args and returns its result line, whether
// it judged the server right, and what it said on stderr.
func runLoadgen(t *testing.T, args ...string) (result string, ok bool, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	ok, err := run(args, &out, &errs)
	if err != nil {
		t.Fatalf("loadgen %v: %v (stderr %q)", args, err, errs.String())
	}
	return out.String(), ok, errs.String()
}

// field returns the value of name=value field k of loadgen's result line.
func field(t *testing.T, line, k string) int {
	t.Helper()
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, k+"="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s=%q in %q", k, v, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", k, line)
	return 0
}

// TestAgainstMemcached runs every load shape of the comparison, on event
// loops and on goroutines, against a real memcached: every value read
// must check out, and the requests asked for must all be made.
func TestAgainstMemcached(t *testing.T) {
	addr := memcachedtest.Start(t)
	for _, loops := range []string{"-1", "2", "0"} {
		for _, shape := range [][]string{
			{"--multiget", "1", "--get-ratio", "0.9"},
			{"--multiget", "10", "--get-ratio", "0.9"},
			{"--multiget", "100", "--value-size", "3072", "--conns", "8"},
			{"--multiget", "1", "--get-ratio", "0.5", "--value-size", "200000", "--keys", "40"},
		} {
			args := append([]string{"--addr", addr, "--requests", "3000", "--keys", "500", "--event-loops", loops}, shape...)
			line, ok, stderr := runLoadgen(t, args...)
			if !ok || field(t, line, "wrong") != 0 || field(t, line, "errors") != 0 {
				t.Fatalf("%v: %s%s", args, line, stderr)
			}
			if got := field(t, line, "requests"); got != 3000 {
				t.Errorf("%v: %d requests, want 3000", args, got)
			}
			if field(t, line, "gets") == 0 || field(t, line, "sets") == 0 || field(t, line, "misses") != 0 {
				t.Errorf("%v: %s", args, line)
			}
		}
	}
}

// TestFindsWrongValues has a server that serves one byte of one value
// wrong, now and then, among good replies: loadgen must count them.
func TestFindsWrongValues(t *testing.T) {
	mc := memcachedtest.Start(t)
	addr := serveRelay(t, func(c net.Conn) { corruptingRelay(c, mc) })
	for _, mode := range [][]string{{"--event-loops", "-1"}, {"--event-loops", "0"}, {"--rate", "4000"}} {
		line, ok, _ := runLoadgen(t, append([]string{"--addr", addr, "--requests", "2000", "--keys", "200", "--conns", "4", "--get-ratio", "0.9"}, mode...)...)
		if ok || field(t, line, "wrong") == 0 {
			t.Errorf("%v: a corrupted value went unnoticed: %s", mode, line)
		}
	}
}

// corruptingRelay passes c's requests to memcached at mc and its replies
// back, flipping a byte in every 50th value (past its header).
func corruptingRelay(c net.Conn, mc string) {
	defer c.Close()
	up, err := net.Dial("tcp", mc)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				up.Close()
				return
			}
			up.Write(buf[:n])
		}
	}()
	rd := bufio.NewReader(up)
	values := 0
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return
		}
		if !bytes.HasPrefix(line, []byte("VALUE ")) {
			c.Write(line)
			continue
		}
		var key string
		var flags, size int
		if _, err := fmt.Sscanf(string(line), "VALUE %s %d %d", &key, &flags, &size); err != nil {
			return
		}
		data := make([]byte, size+2)
		if _, err := io.ReadFull(rd, data); err != nil {
			return
		}
		if values++; values%50 == 0 {
			data[size-1] ^= 0x20
		}
		c.Write(append(line, data...))
	}
}

// TestReplyScan feeds replies to replyScan a byte at a time and in one
// piece: it must find each one's end exactly, and no sooner.
func TestReplyScan(t *testing.T) {
	value := bytes.Repeat([]byte("a\r\nEND\r\n"), 40)
	for _, tc := range []struct {
		reply string
		get   bool
	}{
		{"STORED\r\n", false},
		{"SERVER_ERROR out of memory\r\n", false},
		{"END\r\n", true},
		{"VALUE k 0 3\r\nEND\r\nEND\r\n", true},
		{"VALUE k 1 320\r\n" + string(value) + "\r\nVALUE j 2 0\r\n\r\nEND\r\n", true},
		{"CLIENT_ERROR bad data chunk\r\n", true},
		{"VALUE k 0 x\r\n", true}, // broken framing ends the reply at once
	} {
		whole := []byte(tc.reply + "STORED\r\n") // what follows is not part of it
		var r replyScan
		r.get = tc.get
		for i := 0; i <= len(whole); i++ {
			got := r.end(whole[:i])
			want := 0
			if i >= len(tc.reply) {
				want = len(tc.reply)
			}
			if got != want {
				t.Fatalf("%q: after %d bytes: end %d, want %d", tc.reply, i, got, want)
			}
			if got > 0 {
				break
			}
		}
		r = replyScan{get: tc.get}
		if got := r.end(whole); got != len(tc.reply) {
			t.Errorf("%q in one piece: end %d, want %d", tc.reply, got, len(tc.reply))
		}
	}
}

// TestIsValue: isValue accepts exactly what appendValue writes.
func TestIsValue(t *testing.T) {
	for _, size := range []int{51, 64, 1024, 3077} {
		cfg := &config{valueSize: size, seed: 7, keyPrefix: "lg:", pad: newPad(7, size)}
		v := appendValue(nil, cfg, 42, 3)
		if !isValue(v, cfg, 42, 3) {
			t.Fatalf("size %d: its own value rejected", size)
		}
		if isValue(v, cfg, 42, 4) || isValue(v, cfg, 43, 3) || isValue(v[:size-1], cfg, 42, 3) {
			t.Errorf("size %d: accepted for another key, version or length", size)
		}
		for i := range v {
			v[i] ^= 1
			if isValue(v, cfg, 42, 3) {
				t.Fatalf("size %d: byte %d flipped, still accepted", size, i)
			}
			v[i] ^= 1
		}
	}
}

// TestLoopTimesOut has a server that answers the pre-population and then
// nothing: the connection on the event loop must give up after --timeout
// and loadgen end, judging the server wrong.
func TestLoopTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		for answered := 0; ; answered++ {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			var key string
			var flags, exp, size int
			if _, err := fmt.Sscanf(line, "set %s %d %d %d", &key, &flags, &exp, &size); err == nil {
				if _, err := io.ReadFull(rd, make([]byte, size+2)); err != nil {
					return
				}
			}
			if answered < 4 { // the four keys of the pre-population
				c.Write([]byte("STORED\r\n"))
			}
		}
	}()
	start := time.Now()
	line, ok, stderr := runLoadgen(t, "--addr", ln.Addr().String(), "--conns", "1", "--keys", "4", "--duration", "30s", "--timeout", "300ms")
	if ok || field(t, line, "errors") != 1 || !strings.Contains(stderr, errReplyTimeout.Error()) {
		t.Errorf("a silent server: %s%s", line, stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("loadgen took %v to give up on a silent server", took)
	}
}

// TestFlagsRefused: settings that cannot work are refused before any
// connection is made.
func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shape", "postings"}, "--shape must be one of plain, dm, raw-postings, series"},
		{[]string{"--shape", "dm", "--value-size", "3072"}, "--value-size is for --shape plain"},
		{[]string{"--shape", "series", "--key-prefix", "S:"}, "--key-prefix is for --shape plain"},
		{[]string{"--shape", "raw-postings", "--value-size", "1024"}, "--value-size is for --shape plain"},
		{[]string{"--rate", "-1"}, "--rate must be a number of requests per second"},
		{[]string{"--rate", "NaN"}, "--rate must be a number of requests per second"},
		{[]string{"--rate", "+Inf"}, "--rate must be a number of requests per second"},
		{[]string{"--rate", "100", "--event-loops", "0"}, "--rate runs on the event loops only"},
		{[]string{"--rate", "100", "--tls"}, "--rate runs on the event loops only"},
	} {
		args := append([]string{"--addr", "127.0.0.1:1", "--requests", "10"}, tc.args...)
		var out, errs bytes.Buffer
		_, err := run(args, &out, &errs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

// Key formats of Mimir's index cache (see the package doc of shapes.go):
// the tenant's 150 characters, a ULID, then a base64url label id or a
// decimal series reference.
var (
	p2Key     = regexp.MustCompile(`^P2:[a-zA-Z0-9!\-_.*'()]{150}:[0-7][0-9A-HJKMNP-TV-Z]{25}:[A-Za-z0-9_-]{43}$`)
	seriesKey = regexp.MustCompile(`^S:[a-zA-Z0-9!\-_.*'()]{150}:[0-7][0-9A-HJKMNP-TV-Z]{25}:[0-9]+$`)
)

// TestMimirKeys: postings keys are 224 bytes and series keys at most 192,
// in Mimir's formats, one tenant per seed, no two keys alike.
func TestMimirKeys(t *testing.T) {
	tenant := func(key []byte) string { return strings.SplitN(string(key), ":", 3)[1] }
	for _, tc := range []struct {
		shape  string
		format *regexp.Regexp
		minLen int
		maxLen int
	}{
		{shapeDM, p2Key, 224, 224},
		{shapeRawPostings, p2Key, 224, 224},
		{shapeSeries, seriesKey, 184, 192},
	} {
		sh := newShape(&config{shapeName: tc.shape, seed: 3})
		seen := map[string]bool{}
		blocks := map[string]bool{}
		for _, key := range []int{0, 1, 2, 3, 4, 5, 99, 100, 4096, 1<<20 + 7, 1<<31 - 2} {
			k := sh.appendKey(nil, key)
			if !tc.format.Match(k) || len(k) < tc.minLen || len(k) > tc.maxLen {
				t.Errorf("%s key %d: %q (%d bytes)", tc.shape, key, k, len(k))
			}
			if seen[string(k)] {
				t.Errorf("%s: key %d named %q like another", tc.shape, key, k)
			}
			seen[string(k)] = true
			blocks[strings.Split(string(k), ":")[2]] = true
			if tenant(k) != tenant(sh.appendKey(nil, 0)) {
				t.Errorf("%s: key %d has another tenant", tc.shape, key)
			}
		}
		if len(blocks) != mimirBlocks {
			t.Errorf("%s: keys in %d blocks, want %d", tc.shape, len(blocks), mimirBlocks)
		}
		other := newShape(&config{shapeName: tc.shape, seed: 4})
		if tenant(other.appendKey(nil, 0)) == tenant(sh.appendKey(nil, 0)) {
			t.Errorf("%s: seeds 3 and 4 have the same tenant", tc.shape)
		}
	}
}

// decodeDM takes a dm value apart as Mimir's postings codec reads it: the
// matchers key, the pending matchers and the postings.
func decodeDM(t *testing.T, v []byte) (matchers string, pending []string, refs []uint32) {
	t.Helper()
	rest, ok := bytes.CutPrefix(v, []byte("dm"))
	if !ok {
		t.Fatalf("no dm prefix: %q", v[:min(len(v), 8)])
	}
	str := func() string {
		n, l := binary.Uvarint(rest)
		if l <= 0 || uint64(len(rest)-l) < n {
			t.Fatalf("bad length at %q", rest[:min(len(rest), 8)])
		}
		s := string(rest[l : l+int(n)])
		rest = rest[l+int(n):]
		return s
	}
	matchers = str()
	n, l := binary.Uvarint(rest)
	rest = rest[l:]
	for range n {
		name := str()
		typ := rest[0]
		rest = rest[1:]
		pending = append(pending, fmt.Sprintf("%s/%d/%s", name, typ, str()))
	}
	raw, err := snappy.Decode(nil, rest)
	if err != nil {
		t.Fatalf("postings block: %v", err)
	}
	prev := uint64(0)
	for len(raw) > 0 {
		d, l := binary.Uvarint(raw)
		if l <= 0 {
			t.Fatalf("bad uvarint in the postings")
		}
		raw = raw[l:]
		prev += d
		refs = append(refs, uint32(prev))
	}
	return matchers, pending, refs
}

// TestDMValues: a dm value decodes to the matchers naming its key and
// version and to the postings its block was built from, strictly
// ascending; values are about 3 KB; isValue accepts exactly the value.
func TestDMValues(t *testing.T) {
	s := newDMShape(5)
	total := 0
	const n = 1000
	for key := range n {
		v := uint32(1 + key%3)
		val := s.appendValue(nil, key, v)
		total += len(val)
		matchers, pending, refs := decodeDM(t, val)
		if want := fmt.Sprintf("__name__=lg_postings\x00lg_key=%d\x00lg_version=%d\x00", key, v); matchers != want {
			t.Fatalf("key %d: matchers %q, want %q", key, matchers, want)
		}
		if len(pending) > 1 || len(pending) == 1 && pending[0] != "pod/2/lg-.+" {
			t.Fatalf("key %d: pending matchers %q", key, pending)
		}
		if !slices.Equal(refs, dmRefs(5, s.block(key, v))) {
			t.Fatalf("key %d: the postings differ from those the block was built from", key)
		}
		for i := 1; i < len(refs); i++ {
			if refs[i] <= refs[i-1] {
				t.Fatalf("key %d: refs %d and %d not ascending", key, refs[i-1], refs[i])
			}
		}
		if len(val) < 1800 || len(val) > 4500 {
			t.Errorf("key %d: %d bytes", key, len(val))
		}
		if key < 20 {
			checkIsValue(t, s, key, v, val)
		}
	}
	if avg := total / n; avg < 2700 || avg > 3400 {
		t.Errorf("dm values average %d bytes, want about 3 KB", avg)
	}
}

// checkIsValue: isValue accepts val as version v of key, and not as
// another version or key, nor cut short, nor with a byte changed (any
// byte of a short value, 200 or so spread over a long one).
func checkIsValue(t *testing.T, s shape, key int, v uint32, val []byte) {
	t.Helper()
	if !s.isValue(val, key, v) {
		t.Fatalf("key %d: its own value rejected", key)
	}
	if s.isValue(val, key, v+1) || s.isValue(val, key+1, v) || s.isValue(val[:len(val)-1], key, v) {
		t.Errorf("key %d: accepted for another key, version or length", key)
	}
	step := max(1, len(val)/200)
	for i := 0; i < len(val); i += step {
		val[i] ^= 1
		if s.isValue(val, key, v) {
			t.Fatalf("key %d: byte %d flipped, still accepted", key, i)
		}
		val[i] ^= 1
	}
}

// TestRawPostingsValues: raw postings values are strictly ascending
// big-endian uint32 lists of 10 to 50,000 references, about 23 KB on
// average.
func TestRawPostingsValues(t *testing.T) {
	s := newRawShape(5)
	total, shortest, longest := 0, 1<<30, 0
	const n = 3000
	for key := range n {
		val := s.appendValue(nil, key, 1)
		if len(val)%4 != 0 || len(val) < 4*rawPostingsMin || len(val) > 4*rawPostingsMax {
			t.Fatalf("key %d: %d bytes", key, len(val))
		}
		for i := 4; i < len(val); i += 4 {
			if binary.BigEndian.Uint32(val[i:]) <= binary.BigEndian.Uint32(val[i-4:]) {
				t.Fatalf("key %d: not strictly ascending at reference %d", key, i/4)
			}
		}
		total += len(val)
		shortest, longest = min(shortest, len(val)), max(longest, len(val))
		if key < 3 {
			checkIsValue(t, s, key, 1, val)
		}
	}
	if avg := total / n; avg < 20_000 || avg > 27_000 {
		t.Errorf("raw postings average %d bytes, want about 23 KB", avg)
	}
	if shortest > 200 || longest < 120_000 {
		t.Errorf("raw postings from %d to %d bytes: not spread over 40 B to 200 KB", shortest, longest)
	}
}

// TestSeriesValues: series values are a few hundred bytes.
func TestSeriesValues(t *testing.T) {
	s := newSeriesShape(5)
	total := 0
	const n = 1000
	for key := range n {
		val := s.appendValue(nil, key, 2)
		if len(val) < 100 || len(val) > 600 {
			t.Errorf("key %d: %d bytes", key, len(val))
		}
		total += len(val)
		if key < 20 {
			checkIsValue(t, s, key, 2, val)
		}
	}
	if avg := total / n; avg < 200 || avg > 450 {
		t.Errorf("series values average %d bytes, want a few hundred", avg)
	}
}

// TestSidecarSeesShapes has the sidecar's codec, with its defaults,
// envelope the Mimir-shaped values as it would under their keys: it must
// recognise dm values as compressed already and store them as they are,
// compress raw postings lists to a fraction of their size, and envelope
// series values, under a key it does not treat as postings-bearing, not
// at all.
func TestSidecarSeesShapes(t *testing.T) {
	var cfg codec.Config
	cfg.RegisterFlags(pflag.NewFlagSet("codec", pflag.ContinueOnError))
	c, err := codec.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dm, raw, series := newDMShape(1), newRawShape(1), newSeriesShape(1)
	var dmIn, dmOut, rawIn, rawOut int
	for key := range 200 {
		k, v := dm.appendKey(nil, key), dm.appendValue(nil, key, 1)
		if !c.PostingsKey(k) {
			t.Fatalf("%q is not a postings key to the codec", k)
		}
		out, _ := c.AppendEncodePostings(nil, k, false, 1, v)
		dmIn, dmOut = dmIn+len(v), dmOut+len(out)
		k, v = raw.appendKey(nil, key), raw.appendValue(nil, key, 1)
		out, _ = c.AppendEncodePostings(nil, k, false, 1, v)
		rawIn, rawOut = rawIn+len(v), rawOut+len(out)
		if k := series.appendKey(nil, key); c.ShouldEnvelope(k, 1) {
			t.Errorf("series key %q enveloped", k)
		}
	}
	if dmOut < dmIn || dmOut > dmIn+200*32 {
		t.Errorf("dm values: %d bytes stored for %d: not stored as they are", dmOut, dmIn)
	}
	if rawOut > rawIn/3 {
		t.Errorf("raw postings: %d bytes stored for %d: not compressed as postings", rawOut, rawIn)
	}
	t.Logf("dm: %d bytes stored for %d; raw postings: %d for %d", dmOut, dmIn, rawOut, rawIn)
}

// TestShapesAgainstMemcached runs each Mimir shape, in 100-key gets (50
// for the big raw postings lists, to stay within the test's memcached),
// against a real memcached, on event loops and on goroutines: every value
// read must check out.
func TestShapesAgainstMemcached(t *testing.T) {
	addr := memcachedtest.Start(t)
	for _, loops := range []string{"-1", "0"} {
		for _, shape := range [][]string{
			{"--shape", "dm", "--keys", "300", "--multiget", "100"},
			{"--shape", "raw-postings", "--keys", "100", "--multiget", "50"},
			{"--shape", "series", "--keys", "300", "--multiget", "100"},
		} {
			args := append([]string{"--addr", addr, "--requests", "400", "--conns", "8", "--event-loops", loops}, shape...)
			line, ok, stderr := runLoadgen(t, args...)
			if !ok || field(t, line, "wrong") != 0 || field(t, line, "errors") != 0 || field(t, line, "misses") != 0 {
				t.Fatalf("%v: %s%s", args, line, stderr)
			}
			if field(t, line, "requests") != 400 || field(t, line, "gets") == 0 || field(t, line, "sets") == 0 {
				t.Errorf("%v: %s", args, line)
			}
			for _, f := range []string{"items/s=", "batch_p50=", "batch_p99="} {
				if !strings.Contains(line, " "+f) || strings.Contains(line, " "+f+"0.0") {
					t.Errorf("%v: no %s figure in %s", args, f, line)
				}
			}
		}
	}
}

// TestOpenLoop runs each shape in an open loop against a real memcached,
// fast enough for requests to overlap on a connection (a set and a get of
// the same key among them): every value read must check out, and the
// requests asked for must all be made.
func TestOpenLoop(t *testing.T) {
	addr := memcachedtest.Start(t)
	for _, shape := range [][]string{
		{"--shape", "plain", "--keys", "300", "--multiget", "10"},
		{"--shape", "dm", "--keys", "300", "--multiget", "100"},
		{"--shape", "raw-postings", "--keys", "100", "--multiget", "20"},
		{"--shape", "series", "--keys", "300", "--multiget", "100"},
	} {
		args := append([]string{"--addr", addr, "--requests", "600", "--conns", "4", "--get-ratio", "0.5", "--rate", "3000"}, shape...)
		line, ok, stderr := runLoadgen(t, args...)
		if !ok || field(t, line, "wrong") != 0 || field(t, line, "errors") != 0 || field(t, line, "misses") != 0 {
			t.Fatalf("%v: %s%s", args, line, stderr)
		}
		if field(t, line, "requests") != 600 || field(t, line, "gets") == 0 || field(t, line, "sets") == 0 {
			t.Errorf("%v: %s", args, line)
		}
	}
}

// TestOpenLoopShowsStall has a server that holds one connection's
// replies for 300 ms once: in an open loop every request due meanwhile
// waits, and its latency counts from when it was due, so the stall must
// show in the p99 (a closed loop would hide it in a single request).
func TestOpenLoopShowsStall(t *testing.T) {
	mc := memcachedtest.Start(t)
	var gets atomic.Int64
	addr := serveRelay(t, func(c net.Conn) { stallingRelay(c, mc, &gets) })
	line, ok, stderr := runLoadgen(t, "--addr", addr, "--requests", "1000", "--rate", "1000", "--keys", "100", "--conns", "4")
	if !ok {
		t.Fatalf("%s%s", line, stderr)
	}
	p99 := strings.TrimSuffix(strings.Fields(line[strings.Index(line, " p99="):])[0][len("p99="):], "us")
	if us, err := strconv.ParseFloat(p99, 64); err != nil || us < 100_000 {
		t.Errorf("p99 %sus, want the 300 ms stall in it: %s", p99, line)
	}
}

// serveRelay listens on a free loopback port until the test ends and
// hands each connection to relay, and returns the address.
func serveRelay(t *testing.T, relay func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(c)
		}
	}()
	return ln.Addr().String()
}

// stallingRelay passes c's requests to memcached at mc and its replies
// back, holding the reply that ends the 200th get over all connections
// (counted in gets) for 300 ms.
func stallingRelay(c net.Conn, mc string, gets *atomic.Int64) {
	defer c.Close()
	up, err := net.Dial("tcp", mc)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		io.Copy(up, c)
		up.Close()
	}()
	rd := bufio.NewReader(up)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return
		}
		if string(line) == "END\r\n" && gets.Add(1) == 200 {
			time.Sleep(300 * time.Millisecond)
		}
		c.Write(line)
	}
}
