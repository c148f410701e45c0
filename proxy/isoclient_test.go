package proxy

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An isoClient is one client of the isolation tests: on a connection of
// its own it pipelines a random mix of requests over keys and values of
// its own, and holds every reply it reads to what memcached could have
// answered that request of that client. Every key and value names the
// client (and the seed), and its counters live in a range of numbers of
// their own, so that a byte of another client's reply is recognisable.
//
// What it checks is data: a value read must be one the client wrote to
// that key (appends included, each at most once and in order), and a
// counter read must be its base plus some of the client's own increments
// and decrements, each applied at most once: increment j adds 3^j and
// decrement j subtracts it, so the balanced-ternary digits of the
// difference say which were applied, and one applied twice shows as a
// digit they cannot have. A byte replaced by faultMark on the way may
// stand for any byte. One-line status replies are checked for their kind
// only: one STORED cannot be told from another by its content.
type isoClient struct {
	id    int
	seed  uint64
	rng   *rand.Rand
	shape isoShape

	// bases are the values written to each data key by set and add, and
	// appends the suffixes appended to it, in the order sent. An append
	// whose fate is unknown (answered SERVER_ERROR, or unanswered when its
	// connection ended) is in unsure: memcached may still apply it at any
	// later time, after appends sent later on another connection, so it
	// may stand anywhere in the value, though still at most once.
	bases   map[string][]string
	appends map[string][]string
	unsure  map[string]bool
	// counters are the counter keys by epoch: each epoch's counter is
	// set to its base once and then incremented or decremented up to
	// isoCounterOps times.
	counters map[string]*isoCounter
	counter  string // the current epoch's key
	epoch    int
	values   int // values and suffixes made so far

	problems []string
	foreign  int // problems that carry another client's key, value or number
	replies  int
	errors   int // SERVER_ERROR replies
	hits     int // VALUE blocks
	redials  int // connections dialled again after the proxy closed one (or a problem)
}

// isoShape is the load a client makes: batches of up to maxBatch requests,
// retrievals of up to maxKeys keys, over dataKeys keys.
type isoShape struct {
	maxBatch, maxKeys, dataKeys int
	// bigValues is the chance that a value written is large (1–20 KB).
	bigValues float64
}

type isoCounter struct {
	base  uint64
	signs []int8 // operation j added signs[j] * 3^j
}

// isoCounterOps is the most operations on one counter: the sum of 3^j
// below it stays under 2e8, within the counter's range.
const isoCounterOps = 18

// isoRequest is one request sent, with what its reply may be.
type isoRequest struct {
	cmd  string
	keys []string // a retrieval's keys, or the one key
	op   int      // incr and decr: the operation's index on its counter
	data string   // append: the suffix
}

func newIsoClient(id int, seed uint64, shape isoShape) *isoClient {
	return &isoClient{
		id: id, seed: seed, shape: shape,
		rng:      rand.New(rand.NewPCG(seed, uint64(id)+1)),
		bases:    map[string][]string{},
		appends:  map[string][]string{},
		unsure:   map[string]bool{},
		counters: map[string]*isoCounter{},
	}
}

// key returns the client's key of kind 'k' (data) or 'n' (counter) and
// number i. Every key of the tests has one length, so a key that lost or
// gained a byte on the way is no key a client asks for.
func (c *isoClient) key(kind byte, i int) string {
	return fmt.Sprintf("s%08dc%02d:%c%03d", c.seed%1e8, c.id, kind, i)
}

// counterBase is where epoch e's counter starts: client i's counters are
// all between (i+1)e10 and (i+2)e10, each epoch's within 2e8 of its base.
func (c *isoClient) counterBase(e int) uint64 {
	return uint64(c.id+1)*1e10 + uint64(e%9)*1e9 + 5e8
}

// batch draws the next batch of requests and returns them with their wire
// form. What each may change is recorded as it is drawn, before it is sent.
func (c *isoClient) batch() ([]isoRequest, []byte) {
	b := &isoBatch{}
	for range 1 + c.rng.IntN(c.shape.maxBatch) {
		k := c.key('k', c.rng.IntN(c.shape.dataKeys))
		switch n := c.rng.IntN(100); {
		case n < 22:
			c.retrieval(b, "get")
		case n < 30:
			c.retrieval(b, "gets")
		case n < 45:
			c.store(b, "set", k, c.newValue(k))
		case n < 52:
			c.store(b, "add", k, c.newValue(k))
		case n < 60:
			c.values++
			suffix := fmt.Sprintf("+c%02da%05d", c.id, c.values)
			c.appends[k] = append(c.appends[k], suffix)
			b.add(isoRequest{cmd: "append", keys: []string{k}, data: suffix}, "append %s 0 0 %d\r\n%s\r\n", k, len(suffix), suffix)
		case n < 68:
			b.add(isoRequest{cmd: "delete", keys: []string{k}}, "delete %s\r\n", k)
		case n < 76:
			if c.counter != "" && c.rng.IntN(3) == 0 {
				k = c.counter
			}
			b.add(isoRequest{cmd: "touch", keys: []string{k}}, "touch %s 0\r\n", k)
		default:
			c.arithmetic(b)
		}
	}
	return b.reqs, b.wire
}

// isoBatch gathers a batch's requests and their wire form.
type isoBatch struct {
	reqs []isoRequest
	wire []byte
}

func (b *isoBatch) add(r isoRequest, format string, args ...any) {
	b.reqs = append(b.reqs, r)
	b.wire = fmt.Appendf(b.wire, format, args...)
}

// retrieval asks for one to maxKeys of the client's keys, now and then a
// counter's.
func (c *isoClient) retrieval(b *isoBatch, cmd string) {
	r := isoRequest{cmd: cmd}
	for range 1 + c.rng.IntN(c.shape.maxKeys) {
		k := c.key('k', c.rng.IntN(c.shape.dataKeys))
		if c.counter != "" && c.rng.IntN(4) == 0 {
			k = c.key('n', c.rng.IntN(c.epoch+1))
		}
		r.keys = append(r.keys, k)
	}
	b.add(r, "%s %s\r\n", cmd, strings.Join(r.keys, " "))
}

// store writes v to k with set or add.
func (c *isoClient) store(b *isoBatch, cmd, k, v string) {
	c.bases[k] = append(c.bases[k], v)
	b.add(isoRequest{cmd: cmd, keys: []string{k}}, "%s %s 0 0 %d\r\n%s\r\n", cmd, k, len(v), v)
}

// arithmetic increments or decrements the current counter by its next
// power of three, starting the next epoch's counter first when this one
// has had its operations (or now and then earlier).
func (c *isoClient) arithmetic(b *isoBatch) {
	if c.counter == "" || len(c.counters[c.counter].signs) == isoCounterOps || c.rng.IntN(12) == 0 {
		if c.counter != "" {
			c.epoch++
		}
		c.counter = c.key('n', c.epoch)
		base := c.counterBase(c.epoch)
		c.counters[c.counter] = &isoCounter{base: base}
		v := strconv.FormatUint(base, 10)
		b.add(isoRequest{cmd: "set", keys: []string{c.counter}}, "set %s 0 0 %d\r\n%s\r\n", c.counter, len(v), v)
	}
	ctr := c.counters[c.counter]
	cmd, sign := "incr", int8(1)
	if c.rng.IntN(3) == 0 {
		cmd, sign = "decr", -1
	}
	op := len(ctr.signs)
	ctr.signs = append(ctr.signs, sign)
	b.add(isoRequest{cmd: cmd, keys: []string{c.counter}, op: op}, "%s %s %d\r\n", cmd, c.counter, pow3(op))
}

// newValue makes a value for k that no other write makes: the key, a
// serial number, and padding that names the client.
func (c *isoClient) newValue(k string) string {
	c.values++
	v := fmt.Sprintf("%s:v%05d:", k, c.values)
	n := c.rng.IntN(200)
	if c.rng.Float64() < c.shape.bigValues {
		n = 1000 + c.rng.IntN(20000)
	}
	pad := fmt.Sprintf("c%02d.", c.id)
	return v + strings.Repeat(pad, n/len(pad)+1)[:n]
}

func pow3(j int) uint64 {
	p := uint64(1)
	for range j {
		p *= 3
	}
	return p
}

// run sends up to batches batches and checks every reply, stopping early
// once the deadline passes or it has found three problems. A connection
// the proxy closes is dialled again. Each reply is due within
// 10 s (a reply later than that is a problem), and none is waited for
// longer than 2 s after the deadline (the proxy may still be working
// through timeouts then, one request after another).
func (c *isoClient) run(addr string, batches int, deadline time.Time) {
	var nc net.Conn
	var br *bufio.Reader
	defer func() {
		if nc != nil {
			nc.Close()
		}
	}()
	for b := 0; b < batches && len(c.problems) < 3 && time.Now().Before(deadline); b++ {
		if nc == nil {
			var err error
			if nc, err = net.DialTimeout("tcp", addr, 2*time.Second); err != nil {
				c.problem("dial: %v", err)
				return
			}
			br = bufio.NewReader(nc)
		}
		reqs, w := c.batch()
		nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		// Written aside, so that a batch larger than the socket buffers
		// cannot wait on replies not yet read.
		written := make(chan struct{})
		go func() {
			nc.Write(w)
			close(written)
		}()
		if !c.readReplies(nc, br, reqs, deadline.Add(2*time.Second)) {
			nc.Close()
			nc = nil
			c.redials++
		}
		<-written
	}
}

// readReplies reads and checks the replies to reqs. It returns false when
// the connection is to be dialled again: the proxy closed it, or a
// problem left the replies out of step.
func (c *isoClient) readReplies(nc net.Conn, br *bufio.Reader, reqs []isoRequest, last time.Time) bool {
	for i, r := range reqs {
		due := time.Now().Add(10 * time.Second)
		if last.Before(due) {
			nc.SetReadDeadline(last)
		} else {
			nc.SetReadDeadline(due)
		}
		reply, err := readReply(br)
		if err != nil {
			for _, u := range reqs[i:] {
				c.mayLandLater(u)
			}
			if p := c.checkPartial(r, reply); p != "" {
				c.problem("%s %s: partial reply %q before %v: %s", r.cmd, strings.Join(r.keys, " "), short(reply), err, p)
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() && due.Before(last) {
				c.problem("%s %s (request %d of %d): no reply within 10 s", r.cmd, strings.Join(r.keys, " "), i+1, len(reqs))
			}
			return false
		}
		c.replies++
		if p := c.check(r, reply); p != "" {
			c.problem("%s %s (request %d of %d) answered %q: %s", r.cmd, strings.Join(r.keys, " "), i+1, len(reqs), short(reply), p)
			return false
		}
	}
	return true
}

func (c *isoClient) problem(format string, args ...any) {
	p := fmt.Sprintf("client %d: ", c.id) + fmt.Sprintf(format, args...)
	if who := c.otherClient(p); who != "" {
		c.foreign++
		p += " [carries " + who + "]"
	}
	c.problems = append(c.problems, p)
}

// mayLandLater records that r's fate is unknown.
func (c *isoClient) mayLandLater(r isoRequest) {
	if r.cmd == "append" {
		c.unsure[r.data] = true
	}
}

// check says what is wrong with reply as the reply to r, or returns "".
func (c *isoClient) check(r isoRequest, reply string) string {
	if strings.HasPrefix(reply, "SERVER_ERROR ") && strings.Count(reply, "\n") == 1 && strings.HasSuffix(reply, "\r\n") {
		c.errors++
		c.mayLandLater(r)
		return ""
	}
	switch line := strings.TrimSuffix(reply, "\r\n"); r.cmd {
	case "get", "gets":
		return c.checkRetrieval(r, reply)
	case "set", "add", "append":
		if !oneOf(reply, "STORED", "NOT_STORED", "EXISTS", "NOT_FOUND") {
			return "not a reply to " + r.cmd
		}
	case "delete":
		if !oneOf(reply, "DELETED", "NOT_FOUND") {
			return "not a reply to delete"
		}
	case "touch":
		if !oneOf(reply, "TOUCHED", "NOT_FOUND") {
			return "not a reply to touch"
		}
	case "incr", "decr":
		if reply == "NOT_FOUND\r\n" {
			return ""
		}
		n, err := strconv.ParseUint(line, 10, 64)
		if err != nil || !strings.HasSuffix(reply, "\r\n") {
			return "not a reply to " + r.cmd
		}
		ctr := c.counters[r.keys[0]]
		if p := ctr.explain(n); p != "" {
			return p
		}
		if ctr.digit(n, r.op) != ctr.signs[r.op] {
			return fmt.Sprintf("a value without this %s (of %d) applied", r.cmd, pow3(r.op))
		}
	}
	return ""
}

func oneOf(reply string, lines ...string) bool {
	for _, l := range lines {
		if reply == l+"\r\n" {
			return true
		}
	}
	return false
}

// checkRetrieval checks a get's or gets' reply: VALUE blocks of keys the
// request asked, each no more often than asked, with data the client
// wrote, then END.
func (c *isoClient) checkRetrieval(r isoRequest, reply string) string {
	left := map[string]int{}
	for _, k := range r.keys {
		left[k]++
	}
	for strings.HasPrefix(reply, "VALUE ") {
		head, rest, _ := strings.Cut(reply, "\r\n")
		f := strings.Fields(head) // readReply has read the value and two bytes more
		n, _ := strconv.Atoi(f[3])
		data := rest[:n]
		switch {
		case rest[n:n+2] != "\r\n":
			return "a value not ended by CRLF"
		case left[f[1]] == 0:
			return "a VALUE of " + f[1] + ", not asked for (or more often than asked)"
		case f[2] != "0":
			return "flags the client never wrote"
		case len(f) != 4 && r.cmd == "get" || len(f) != 5 && r.cmd == "gets":
			return "a VALUE line of the wrong form for " + r.cmd
		}
		if p := c.checkData(f[1], data); p != "" {
			return p
		}
		left[f[1]]--
		c.hits++
		reply = rest[n+2:]
	}
	if reply != "END\r\n" {
		return "not ended by END"
	}
	return ""
}

// checkPartial looks at the part of a reply read before the connection
// ended: every VALUE line in it must be of a key the request asked.
func (c *isoClient) checkPartial(r isoRequest, partial string) string {
	for _, line := range strings.Split(partial, "\r\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VALUE" {
			asked := false
			for _, k := range r.keys {
				asked = asked || k == f[1]
			}
			if !asked || r.cmd != "get" && r.cmd != "gets" {
				return "a VALUE of " + f[1] + ", not asked for"
			}
		}
	}
	return ""
}

// checkData checks data read as key k's.
func (c *isoClient) checkData(k, data string) string {
	if ctr := c.counters[k]; ctr != nil {
		return ctr.explainData(strings.TrimRight(data, " ")) // decr may leave spaces
	}
	if c.isValue(k, data) {
		return ""
	}
	return "data never written to " + k
}

// isValue reports whether data is a value written to k, followed by
// suffixes appended to it after it, each at most once: any base written,
// then a subsequence of the appends in the order sent, among which the
// unsure ones may stand anywhere.
func (c *isoClient) isValue(k, data string) bool {
	for _, b := range c.bases[k] {
		if len(data) >= len(b) && marked(data[:len(b)], b) && c.isAppended(k, data[len(b):], 0, map[string]bool{}) {
			return true
		}
	}
	return false
}

// isAppended reports whether rest is a run of k's appends, each at most
// once, the sure ones in the order sent from the next-th on, the unsure
// ones anywhere except where used already says they stood.
func (c *isoClient) isAppended(k, rest string, next int, used map[string]bool) bool {
	if rest == "" {
		return true
	}
	appends := c.appends[k]
	for i, s := range appends {
		if len(rest) < len(s) || !marked(rest[:len(s)], s) {
			continue
		}
		switch {
		case c.unsure[s] && !used[s]:
			used[s] = true
			if c.isAppended(k, rest[len(s):], next, used) {
				return true
			}
			used[s] = false
		case !c.unsure[s] && i >= next:
			if c.isAppended(k, rest[len(s):], i+1, used) {
				return true
			}
		}
	}
	return false
}

// marked reports whether got is want with some bytes replaced by faultMark.
func marked(got, want string) bool {
	if got == want {
		return true
	}
	for i := range len(got) {
		if got[i] != want[i] && got[i] != faultMark {
			return false
		}
	}
	return true
}

// explain says what is wrong with n as a value of the counter, or
// returns "": n less its base must be a sum of the counter's operations
// sent so far, each at most once.
func (ctr *isoCounter) explain(n uint64) string {
	d := int64(n - ctr.base)
	for j := 0; d != 0; j++ {
		r := d % 3
		switch r {
		case 2:
			r = -1
		case -2:
			r = 1
		}
		switch {
		case j >= len(ctr.signs):
			return fmt.Sprintf("%d is no sum of this client's %d operations on its counter (base %d)", n, len(ctr.signs), ctr.base)
		case r != 0 && int8(r) != ctr.signs[j]:
			return fmt.Sprintf("%d needs operation %d (of %d) applied twice or the wrong way (base %d)", n, j, pow3(j), ctr.base)
		}
		d = (d - r) / 3
	}
	return ""
}

// digit returns operation j's balanced-ternary digit in n less the base.
func (ctr *isoCounter) digit(n uint64, j int) int8 {
	d := int64(n - ctr.base)
	var r int64
	for range j + 1 {
		r = d % 3
		switch r {
		case 2:
			r = -1
		case -2:
			r = 1
		}
		d = (d - r) / 3
	}
	return int8(r)
}

// explainData checks a counter's data as a get read it. With faultMark in
// it, only the digits every value of the counter shares are checked.
func (ctr *isoCounter) explainData(data string) string {
	if !strings.ContainsRune(data, faultMark) {
		n, err := strconv.ParseUint(data, 10, 64)
		if err != nil {
			return "a counter's data that is no number"
		}
		return ctr.explain(n)
	}
	lo := strconv.FormatUint(ctr.base-2e8, 10)
	hi := strconv.FormatUint(ctr.base+2e8, 10)
	if len(data) != len(lo) || len(hi) != len(lo) {
		return "a counter's data of the wrong length"
	}
	common := 0
	for common < len(lo) && lo[common] == hi[common] {
		common++
	}
	if !marked(data[:common], lo[:common]) {
		return "a counter's data outside its range"
	}
	return ""
}

// otherClient names another client whose bytes p holds, or returns "":
// a client's id follows a "c" in its keys ("c03:"), the padding of its
// values ("c03.") and its appends ("c03a"), and a number of 11 digits or
// more is a counter, in its client's range.
func (c *isoClient) otherClient(p string) string {
	for i := 0; i+3 < len(p); i++ {
		if p[i] != 'c' || !isDigit(p[i+1]) || !isDigit(p[i+2]) || !strings.ContainsRune(".a:", rune(p[i+3])) {
			continue
		}
		if id := int(p[i+1]-'0')*10 + int(p[i+2]-'0'); id != c.id {
			return "client " + strconv.Itoa(id) + "'s key or value"
		}
	}
	for _, w := range strings.FieldsFunc(p, func(r rune) bool { return r > 0xff || !isDigit(byte(r)) }) {
		if n, err := strconv.ParseUint(w, 10, 64); err == nil && len(w) >= 11 {
			if id := int(n/1e10) - 1; id != c.id {
				return "client " + strconv.Itoa(id) + "'s counter"
			}
		}
	}
	return ""
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

// TestIsoClientHoldsValuesToWhatWasWritten checks the checker: appends in
// the order sent pass, each at most once; a sure append out of order, one
// applied twice or another client's fail; an append whose fate is unknown
// may stand anywhere.
func TestIsoClientHoldsValuesToWhatWasWritten(t *testing.T) {
	c := newIsoClient(1, 1, isoShape{})
	k := c.key('k', 0)
	c.bases[k] = []string{"base"}
	c.appends[k] = []string{"+c01a00001", "+c01a00002", "+c01a00003"}
	for _, tc := range []struct {
		data   string
		unsure string
		want   bool
	}{
		{"base", "", true},
		{"base+c01a00001+c01a00003", "", true},
		{"base+c01a0~001+c01a00002", "", true},
		{"base+c01a00002+c01a00001", "", false},
		{"base+c01a00001+c01a00001", "", false},
		{"base+c02a00001", "", false},
		{"other+c01a00001", "", false},
		{"base+c01a00002+c01a00001", "+c01a00001", true},
		{"base+c01a00002+c01a00001+c01a00003", "+c01a00001", true},
		{"base+c01a00001+c01a00003+c01a00001", "+c01a00001", false},
		{"base+c01a00003+c01a00002", "+c01a00001", false},
	} {
		c.unsure = map[string]bool{tc.unsure: tc.unsure != ""}
		if got := c.isValue(k, tc.data); got != tc.want {
			t.Errorf("%q with %q unsure: isValue = %v, want %v", tc.data, tc.unsure, got, tc.want)
		}
	}
}
