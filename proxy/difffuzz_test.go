package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzDifferential decodes its input into request streams of well-formed
// commands, classic and meta, pipelined by one to three clients at once,
// and sends them to memcached and to three proxies, each in front of two
// memcached servers of its own: one on an event loop, one on an event
// loop that envelopes every value (SPEC §4: memcached's semantics hold
// for enveloped items too), and one on an event loop in the first of two
// zones of a server each. Each client's replies must be memcached's, byte
// for byte but for CAS values, which are compared by which of a key's are
// equal (the servers' counters follow the clients' interleaving, and
// behind a proxy each server counts its own). And the servers behind the
// first proxy must have been asked what memcached alone was: the proxy
// sent every command once, lost none, added none; and no zone behind the
// third may hold an item memcached alone does not (see staleInZones),
// which its replies alone need not show.
//
// Where FuzzProxy checks that any input gets replies in memcached's
// grammar, this checks that well-formed input gets memcached's replies:
// pipelining, values long enough to be gathered apart, repeated keys,
// noreply and quiet mode, and gets of many clients joined upstream.
func FuzzDifferential(f *testing.F) {
	for _, seed := range []string{
		// One client: set, then get it with another key.
		"\x00\x00\x00\x05\x00\x00\x06\x00\x01\x01",
		// One client: a value of 131,072 bytes, then gets, gats and a delete.
		"\x00\x00\x01\xff\x40\x05\x00\x06\x01\x01\x00\x07\x01\x02\x01\x03\x0c\x01\x06\x00\x00",
		// Three clients: numbers set, incremented, and fetched together.
		"\x02\x0e\x00\x03\x04\x00\x00\x0e\x00\x03\x04\x00\x00\x0e\x00\x05\x04\x00\x00" +
			"\x0a\x00\x05\x0a\x00\xff\x0b\x00\x07\x06\x00\x03\x01\x02\x03\x06\x00\x03\x01\x02\x03\x06\x00\x03\x01\x02\x03",
		// One client: gets and cas.
		"\x00\x0e\x00\x02\x02\x00\x00\x07\x00\x00\x05\x00\x03\x00\x09\x05\x00\x03\x00\x01\x06\x00\x00",
		// noreply storage, delete and touch, then a get.
		"\x00\x87\x00\x03\x00\x00\x84\x01\x85\x00\x06\x06\x00\x03\x01\x02\x03",
		// Two clients: long values and gets of several keys, in pieces.
		"\x01\x00\x00\xff\x10\x01\x00\x00\x01\xf5\x02\x00\x06\x00\x05\x01\x02\x03\x00\x01\x06\x00\x05\x01\x02\x03\x00\x01" +
			"\x02\x02\x03\x02\x00\x00\x09\x02\x00\x03\x40\x07\x05\x03\x09\x02",
		// One client: meta commands, quiet and not, among classic ones.
		"\x00\x7b\x00\x00\x03\x05\x00\x01\x01\x00\x78\x00\x01\x02\xff\x1f\x7d\x00\x03\x04\x01\x0f\x06\x00\x02\x01\x7e\x00\x01\x01\x07\x05\xff\x0f",
		// Two clients: pipelined mg of hits and misses, some quiet.
		"\x01\x00\x00\x02\x00\x00\x00\x01\x02\x00\x00\x78\x00\x01\x81\x00\x78\x01\x01\x81\x00\x78\x00\x01\x01\x00\x78\x01\x81\x00\x00\x7f\x00\x7f\x00",
	} {
		f.Add([]byte(seed))
	}
	// Memory for the inputs of a run: each input starts with a flush_all.
	// Each proxy spreads the keys over two servers.
	mc := func() string { return startMemcached(f, "-m", "1024") }
	direct := mc()
	upL := []string{mc(), mc()}
	loopCfg := testConfig(upL...)
	loopCfg.EventLoops = 1
	_, viaLoop := startProxy(f, loopCfg)
	// And a loop proxy that envelopes every value: its servers hold other
	// bytes, and it reads, changes and writes back a value to append to
	// it, so only its replies are compared.
	upE := []string{mc(), mc()}
	envCfg := envelopeAllConfig(upE...)
	envCfg.EventLoops = 1
	_, viaEnvelopes := startProxy(f, envCfg)
	// And a loop proxy in zone a of two zones, which writes to both and
	// reads a first.
	upZ := []string{mc(), mc()}
	zoneCfg := zonedConfig("a", zoneEntry("a", upZ[:1]), zoneEntry("b", upZ[1:]))
	zoneCfg.EventLoops = 1
	_, viaZones := startProxy(f, zoneCfg)
	groups := [][]string{{direct}, upL} // the servers counted behind each target
	inputs := 0
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > 4096 {
			t.Skip()
		}
		inputs++
		prefix := fmt.Sprintf("df%d-%d", time.Now().UnixNano(), inputs)
		streams := decodeStreams(input, prefix)
		before := make([]map[string]int64, len(groups))
		for _, addr := range slices.Concat(append(groups, upE, upZ)...) {
			if r, err := converse(addr, []byte("flush_all\r\n"), 5*time.Second); err != nil || string(r.head) != "OK\r\n" {
				t.Fatalf("flush_all of %s: %q, %v", addr, r.head, err)
			}
		}
		for i, g := range groups {
			before[i] = commandCounts(t, g)
		}
		targets := []string{direct, viaLoop, viaEnvelopes, viaZones}
		replies := make([][]string, len(targets))
		var wg sync.WaitGroup
		for i, addr := range targets {
			replies[i] = make([]string, len(streams))
			for c, s := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					replies[i][c] = casByOrder(replayStream(addr, s))
				}()
			}
		}
		wg.Wait()
		for _, rs := range replies {
			for _, r := range rs {
				if strings.Contains(r, "SERVER_ERROR out of memory") {
					// Whether memcached finds room for a value depends on
					// the order the clients' items came in.
					t.Skip("memcached ran out of memory")
				}
			}
		}
		for c, s := range streams {
			want := replies[0][c]
			for i, name := range []string{"event loop", "event loop, every value enveloped", "event loop, two zones"} {
				if got := replies[i+1][c]; got != want {
					t.Errorf("client %d of %d, %s: replies differ from memcached's after %s\nproxy:     %q\nmemcached: %q",
						c, len(streams), name, short(string(s.req)), short(got), short(want))
				}
			}
		}
		var keys []string
		for c := range streams {
			keys = append(keys, streamKeys(prefix, c)...)
		}
		if stale := staleInZones(t, direct, upZ, keys); len(stale) > 0 {
			t.Errorf("a zone holds another item than memcached alone: %s", strings.Join(stale, "; "))
		}
		asked := make([]string, len(groups))
		for i, g := range groups {
			after := commandCounts(t, g)
			var d []string
			for _, k := range commandCounters {
				d = append(d, fmt.Sprintf("%s %d", k, after[k]-before[i][k]))
			}
			asked[i] = strings.Join(d, ", ")
		}
		if asked[1] != asked[0] {
			t.Errorf("memcached was asked %s alone, the servers %s behind the loop", asked[0], asked[1])
		}
	})
}

// staleInZones returns the keys, with both items, that a zone's server
// holds with other bytes or flags than memcached alone holds them. Writes
// go to every zone, and a zone may lack a key (an append drops the other
// zones' copies, a fill comes after the reply), but none may hold an item
// memcached alone does not: a client told a write took finds no older
// copy in any zone. Fills and the deletes undoing them may still be on
// their way when the clients have their replies: a key is reported only
// when it stays stale for a second.
func staleInZones(t *testing.T, direct string, zoneServers []string, keys []string) []string {
	var stale []string
	for try := 0; try < 50; try++ {
		want := heldItems(t, direct, keys)
		stale = stale[:0]
		for _, z := range zoneServers {
			for i, got := range heldItems(t, z, keys) {
				if got != "END\r\n" && got != want[i] {
					stale = append(stale, fmt.Sprintf("%s: %q in %s, %q alone", short(keys[i]), got, z, want[i]))
				}
			}
		}
		if len(stale) == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return stale
}

// heldItems returns the reply of the memcached at addr to a get of each
// key: END, or its VALUE block.
func heldItems(t *testing.T, addr string, keys []string) []string {
	lc := newLineClient(t, addr)
	defer lc.c.Close()
	items := make([]string, len(keys))
	for i, k := range keys {
		items[i] = lc.do("get " + k + "\r\n")
	}
	return items
}

// casByOrder replaces each CAS value of a VALUE line in reply by its rank
// among the CAS values of the line's key in the order they first appear,
// and the value of a meta reply's c flag (whose key the line may not
// name) by "*". CAS values of different keys are not compared: behind a
// proxy they come from different servers, each counting its own.
func casByOrder(reply string) string {
	seen := map[string]map[string]int{}
	lines := strings.SplitAfter(reply, "\n")
	for i, l := range lines {
		switch {
		case casValue.MatchString(l):
			f := strings.Fields(l)
			key, cas := f[1], f[4]
			if seen[key] == nil {
				seen[key] = map[string]int{}
			}
			n, ok := seen[key][cas]
			if !ok {
				n = len(seen[key]) + 1
				seen[key][cas] = n
			}
			lines[i] = strings.Join(f[:4], " ") + " cas#" + strconv.Itoa(n) + "\r\n"
		case metaFlagLine.MatchString(l):
			words := strings.Split(strings.TrimSuffix(l, "\r\n"), " ")
			for k, w := range words[1:] {
				if len(w) > 1 && w[0] == 'c' && strings.Trim(w[1:], "0123456789") == "" {
					words[k+1] = "c*"
				}
			}
			lines[i] = strings.Join(words, " ") + "\r\n"
		}
	}
	return strings.Join(lines, "")
}

// metaFlagLine matches the lines of meta replies that may carry flags.
var metaFlagLine = regexp.MustCompile(`^(HD|VA \d+|EN|NF|NS|EX)( |\r\n)`)

// diffStream is one client's requests, and how many replies (units: a
// line, or VALUE blocks up to END) they get.
type diffStream struct {
	req     []byte
	replies int
	pieces  []int // the sizes of the writes the request is sent in
	// meta: the stream has meta commands, whose quiet mode leaves the
	// number of replies open. It then ends with an mn, and its replies are
	// read up to the MN of its last mn (it has mn of them).
	meta bool
	mn   int
}

// fuzzBytes hands out an input's bytes, then zeros; long counts the
// values over 64 KiB decoded, which are bounded to keep an input quick.
type fuzzBytes struct {
	b    []byte
	long int
}

func (z *fuzzBytes) next() byte {
	if len(z.b) == 0 {
		return 0
	}
	c := z.b[0]
	z.b = z.b[1:]
	return c
}

func (z *fuzzBytes) empty() bool { return len(z.b) == 0 }

// streamKeys returns the four keys client c's stream names.
func streamKeys(prefix string, c int) []string {
	var keys []string
	for k := range 4 {
		key := fmt.Sprintf("%s-c%d-k%d", prefix, c, k)
		if k == 3 { // a key at memcached's limit
			key += strings.Repeat("x", 250-len(key))
		}
		keys = append(keys, key)
	}
	return keys
}

// decodeStreams turns input into the request streams of one to three
// clients, whose keys begin with prefix and the client's number.
func decodeStreams(input []byte, prefix string) []diffStream {
	z := &fuzzBytes{b: input}
	clients := 1 + int(z.next())%3
	streams := make([]diffStream, clients)
	keys := make([][]string, clients)
	bufs := make([]bytes.Buffer, clients)
	for c := range streams {
		keys[c] = streamKeys(prefix, c)
	}
	// The clients' commands are decoded in turn, up to 40 each.
	for n := 0; n < 40*clients && !z.empty(); n++ {
		c := n % clients
		s, b, keys := &streams[c], &bufs[c], keys[c]
		op := z.next()
		key := keys[int(z.next())%len(keys)]
		if op&0x7f >= 0x78 {
			if metaCommand(b, z, op, key, c) {
				s.mn++
			}
			s.meta = true
			continue
		}
		noreply := op&0x80 != 0
		switch op % 15 {
		case 0, 1, 2, 3, 4, 14:
			verb := [...]string{"set", "add", "replace", "append", "prepend"}[min(op%15, 4)]
			if op%15 == 14 {
				verb = "set"
			}
			value := fuzzValue(z, c, op%15 == 14)
			fmt.Fprintf(b, "%s %s %d %s %d", verb, key, z.next(), fuzzExptime(z), len(value))
			s.replies += storageLine(b, noreply)
			b.WriteString(value + "\r\n")
		case 5:
			// A CAS value depends on everything the server stored
			// before: a cas here names one no item has, and is refused.
			value := fuzzValue(z, c, false)
			fmt.Fprintf(b, "cas %s %d 0 %d %d", key, z.next(), len(value), 1<<50+int(z.next()))
			s.replies += storageLine(b, noreply)
			b.WriteString(value + "\r\n")
		case 6, 7, 8, 9:
			verb := [...]string{"get", "gets", "gat", "gats"}[op%15-6]
			b.WriteString(verb)
			if verb == "gat" || verb == "gats" {
				b.WriteString(" " + fuzzExptime(z))
			}
			b.WriteString(" " + key)
			for range int(z.next()) % 6 {
				b.WriteString(" " + keys[int(z.next())%len(keys)])
			}
			b.WriteString("\r\n")
			s.replies++
		case 10, 11:
			delta := uint64(z.next())
			if delta > 250 {
				delta = ^uint64(0) - delta
			}
			fmt.Fprintf(b, "%s %s %d", [...]string{"incr", "decr"}[op%15-10], key, delta)
			s.replies += storageLine(b, noreply)
		case 12:
			fmt.Fprintf(b, "delete %s", key)
			s.replies += storageLine(b, noreply)
		case 13:
			fmt.Fprintf(b, "touch %s %s", key, fuzzExptime(z))
			s.replies += storageLine(b, noreply)
		}
	}
	// Each stream ends with a get, whose reply says that memcached has
	// done every command before it, noreply or not: the next input's CAS
	// values then follow from the same commands everywhere. It is written
	// in pieces the input sizes, the rest at once.
	for c := range streams {
		s := &streams[c]
		if s.meta {
			bufs[c].WriteString("mn\r\n")
			s.mn++
		} else {
			fmt.Fprintf(&bufs[c], "get %s-c%d-end\r\n", prefix, c)
			s.replies++
		}
		s.req = bufs[c].Bytes()
		for left := len(s.req); left > 0; {
			n := left
			if !z.empty() {
				n = min(left, 1+int(z.next())*int(z.next()%64+1))
			}
			s.pieces = append(s.pieces, n)
			left -= n
		}
	}
	return streams
}

// metaCommand writes a meta command decoded from z (op picks which) for
// key, and reports whether it was mn. The flags are picked from those of
// each command but the ones whose answer follows the clock (t, l, a T
// that could pass), base64 keys, and E; they may repeat or clash, as a
// client's may.
func metaCommand(b *bytes.Buffer, z *fuzzBytes, op byte, key string, client int) bool {
	flags := func(choices ...string) {
		pick := uint16(z.next()) | uint16(z.next())<<8
		for i, f := range choices {
			if pick&(1<<i) != 0 {
				b.WriteString(" " + f)
			}
		}
		b.WriteString("\r\n")
	}
	opaque := "O" + strconv.Itoa(int(z.next()))
	noCAS := "C" + strconv.Itoa(1<<50+int(z.next())) // no item has it
	switch op & 7 {
	case 0, 1, 2:
		b.WriteString("mg " + key)
		flags("v", "s", "f", "c", "k", "h", opaque, "q", "T0", "T3600", "N3600", "v", "R30")
	case 3, 4:
		value := fuzzValue(z, client, z.next()%4 == 0)
		fmt.Fprintf(b, "ms %s %d", key, len(value))
		flags("F"+strconv.Itoa(int(z.next())), "T0", "T3600", "q", "c", "k", opaque, "I", "MS", "ME", "MA", "MP", "MR", noCAS, "T-1")
		b.WriteString(value + "\r\n")
	case 5:
		b.WriteString("md " + key)
		flags("q", "k", opaque, "I", "T3600", noCAS)
	case 6:
		b.WriteString("ma " + key)
		flags("N0", "N3600", "J"+strconv.Itoa(int(z.next())), "D"+strconv.Itoa(int(z.next())), "MI", "MD", "v", "c", "k", "q", opaque, noCAS)
	case 7:
		b.WriteString("mn\r\n")
		return true
	}
	return false
}

// storageLine ends a command's line, noreply or not, and returns how many
// replies it gets.
func storageLine(b *bytes.Buffer, noreply bool) int {
	if noreply {
		b.WriteString(" noreply\r\n")
		return 0
	}
	b.WriteString("\r\n")
	return 1
}

// fuzzExptime is 0 mostly; an hour, or -1 (expired at once) otherwise:
// never a time that passes during the test.
func fuzzExptime(z *fuzzBytes) string {
	switch z.next() % 8 {
	case 6:
		return "3600"
	case 7:
		return "-1"
	}
	return "0"
}

// fuzzValue returns a value: a number when numeric (for incr and decr);
// otherwise up to 64 bytes mostly, sometimes a few KiB, and now and then
// over 64 KiB, which the loop gathers apart from its line.
func fuzzValue(z *fuzzBytes, client int, numeric bool) string {
	if numeric {
		return strconv.Itoa(int(z.next()) * int(z.next()))
	}
	n := int(z.next())
	switch {
	case n == 255 && z.long < 4:
		z.long++
		n = 65536 + int(z.next())*1024 // up to about 320 KB
	case n >= 240:
		n = (n - 239) * 700
	default:
		n %= 65
	}
	v := make([]byte, n)
	for i := range v {
		v[i] = byte('a' + (i*7+client+n)%26)
	}
	return string(v)
}

// replayStream sends s to addr in its pieces and returns the replies
// read, up to the number s gets, or what came before a deadline or an
// error.
func replayStream(addr string, s diffStream) string {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	go func() {
		rest := s.req
		for _, n := range s.pieces {
			if _, err := c.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
	}()
	var out bytes.Buffer
	r := bufio.NewReader(io.TeeReader(c, &out))
	for n, mn := 0, 0; s.meta && mn < s.mn || !s.meta && n < s.replies; n++ {
		line, err := readReplyUnit(r)
		if err != nil {
			// What came so far, with the error, differs from memcached's
			// replies unless memcached failed alike.
			return out.String() + "<" + err.Error() + ">"
		}
		if line == "MN\r\n" {
			mn++
		}
	}
	return out.String()
}

// readReplyUnit reads one reply unit: a line, a meta command's VA line
// and its value, or VALUE blocks up to END. It returns the first line.
func readReplyUnit(r *bufio.Reader) (string, error) {
	first := ""
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return first, err
		}
		if first == "" {
			first = line
		}
		if strings.HasPrefix(line, "VA ") {
			f := strings.Fields(line)
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return first, fmt.Errorf("bad VA line %q", line)
			}
			_, err = r.Discard(n + 2)
			return first, err
		}
		if !strings.HasPrefix(line, "VALUE ") {
			return first, nil
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			return first, fmt.Errorf("bad VALUE line %q", line)
		}
		n, err := strconv.Atoi(f[3])
		if err != nil {
			return first, fmt.Errorf("bad VALUE line %q", line)
		}
		if _, err := r.Discard(n + 2); err != nil {
			return first, err
		}
	}
}

// commandCounters are the counters of memcached that follow from the
// commands it was sent alone: not those of retrievals (the proxy asks a
// key named twice in one get once), nor total_items (an incr makes a new
// item or not depending on whether a reply still holds the old one), nor
// incr_misses and decr_misses (a quiet ma with N is asked without N
// first, to learn whether memcached will answer it).
var commandCounters = []string{"cmd_set", "incr_hits", "decr_hits", "cas_hits", "cas_misses", "cas_badval", "delete_hits", "delete_misses"}

// commandCounts returns the commandCounters of the memcached servers at
// addrs, summed.
func commandCounts(t *testing.T, addrs []string) map[string]int64 {
	counts := map[string]int64{}
	for _, addr := range addrs {
		r, err := converse(addr, []byte("stats\r\n"), 5*time.Second)
		if err != nil && len(r.all) == 0 {
			t.Fatalf("stats of %s: %v", addr, err)
		}
		for _, l := range strings.Split(string(r.all), "\r\n") {
			f := strings.Fields(l)
			if len(f) == 3 && f[0] == "STAT" && slices.Contains(commandCounters, f[1]) {
				n, _ := strconv.ParseInt(f[2], 10, 64)
				counts[f[1]] += n
			}
		}
	}
	return counts
}
