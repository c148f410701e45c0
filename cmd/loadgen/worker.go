package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"mcsidecar/proxy/evloop"
)

// Fixed reply lines, compared whole.
var (
	lineStored      = []byte("STORED\r\n")
	lineEnd         = []byte("END\r\n")
	lineValue       = []byte("VALUE ")
	lineServerError = []byte("SERVER_ERROR ")
	crlf            = []byte("\r\n")
)

// errFraming means the reply stream can no longer be trusted; the
// connection is given up.
var errFraming = errors.New("reply framing lost")

// worker is one connection and its share of the key space.
type worker struct {
	id  int
	sh  *shared
	cfg *config
	nc  net.Conn
	rd  *bufio.Reader
	wr  *bufio.Writer
	rng *rand.Rand

	own []uint32 // version last stored, per owned key (key id + j*conns)
	// exact is false once a store of that key failed: the failed store may
	// still land later, over a newer one, so the key stays unknown.
	exact []bool

	dead       bool    // the connection was given up
	one        request // the request in flight on a goroutine
	line       []byte
	want       []byte
	big        []byte
	renewAfter time.Time
	counters

	// On an event loop (see loop.go): the connection, the request being
	// written and the reply being read, the requests in flight (one in a
	// closed loop, any number in an open one), and when the oldest was
	// sent.
	onLoop   bool
	gc       *evloop.Conn
	out      outBuf
	reply    []byte // the rest of the reply being read
	finished bool
	pending  requests
	scan     replyScan    // of the reply to pending.front()
	acc      []byte       // a reply read in pieces
	sentAt   atomic.Int64 // unix nanoseconds, 0 when nothing is in flight; read by the timeout watch
	timedOut atomic.Bool
	// In an open loop (--rate, see pace.go): requests sent so far, and
	// whether the connection will send no more.
	sent    int64
	drained bool
}

// request is one request, sent and waiting for its reply.
type request struct {
	setKey int       // the owned key (index into own) a set stores; -1 for a get
	keys   []int     // a get's key ids
	last   []uint32  // per key of a get: the version this connection last stored, if the key is its own, when the get was sent
	at     time.Time // when it was sent; in an open loop, when it was due
	sent   int64     // when it was sent, in unix nanoseconds
}

// requests are a connection's requests in flight, oldest first, the order
// their replies come back in: a ring whose slots, keys and all, are
// reused. A pointer it returns is good until the next push.
type requests struct {
	slots   []request
	head, n int
}

// push adds a request at the back and returns it to be filled in.
func (q *requests) push() *request {
	if q.n == len(q.slots) {
		slots := make([]request, max(1, 2*len(q.slots)))
		for i := range q.n {
			slots[i] = q.slots[(q.head+i)%len(q.slots)]
		}
		q.slots, q.head = slots, 0
	}
	r := &q.slots[(q.head+q.n)%len(q.slots)]
	q.n++
	return r
}

// front returns the oldest request; there must be one.
func (q *requests) front() *request { return &q.slots[q.head] }

// pop drops the oldest request.
func (q *requests) pop() {
	q.head = (q.head + 1) % len(q.slots)
	q.n--
}

func newWorker(id int, sh *shared) (*worker, error) {
	cfg := sh.cfg
	var nc net.Conn
	var err error
	if cfg.tls {
		nc, err = tls.DialWithDialer(&net.Dialer{Timeout: cfg.timeout}, "tcp", cfg.addr, &tls.Config{InsecureSkipVerify: true})
	} else {
		nc, err = net.DialTimeout("tcp", cfg.addr, cfg.timeout)
	}
	if err != nil {
		return nil, err
	}
	owned := 0
	if id < cfg.keys {
		owned = (cfg.keys-id-1)/cfg.conns + 1
	}
	exact := make([]bool, owned)
	for j := range exact {
		exact[j] = true
	}
	return &worker{
		id:    id,
		sh:    sh,
		cfg:   cfg,
		nc:    nc,
		rd:    bufio.NewReaderSize(nc, 64<<10),
		wr:    bufio.NewWriterSize(nc, 64<<10),
		rng:   rand.New(rand.NewPCG(cfg.seed, uint64(id))),
		own:   make([]uint32, owned),
		exact: exact,
		want:  make([]byte, 0, cfg.valueSize),
	}, nil
}

// renewDeadline keeps a deadline on the connection so that a server that
// stops answering ends the run instead of hanging it. Renewing it only now
// and then keeps the timer off the per-request path.
func (w *worker) renewDeadline(now time.Time) {
	if now.After(w.renewAfter) {
		w.nc.SetDeadline(now.Add(w.cfg.timeout))
		w.renewAfter = now.Add(w.cfg.timeout / 4)
	}
}

func (w *worker) populate() {
	for j := range w.own {
		w.renewDeadline(time.Now())
		if err := w.set(j); err != nil {
			w.fail(err)
			return
		}
	}
	// The pre-population is not part of the measurement.
	w.counters = counters{errors: w.errors, serverErrors: w.serverErrors, wrong: w.wrong}
}

// fail gives up the connection after an I/O error or a broken reply.
func (w *worker) fail(err error) {
	w.errors++
	w.sh.report("conn %d: %v", w.id, err)
	w.nc.Close()
	w.dead = true
}

func (w *worker) loop() {
	if w.dead {
		return // given up during pre-population
	}
	cfg := w.cfg
	for {
		start := time.Now()
		if cfg.duration > 0 && !start.Before(w.sh.end) {
			return
		}
		if cfg.requests > 0 && w.sh.claimed.Add(1) > cfg.requests {
			return
		}
		w.renewDeadline(start)
		var err error
		get := len(w.own) == 0 || w.rng.Float64() < cfg.getRatio
		if get {
			err = w.get()
			w.gets++
		} else {
			err = w.set(w.rng.IntN(len(w.own)))
			w.sets++
		}
		w.requests++
		w.record(uint64(time.Since(start)), get)
		if err != nil {
			w.fail(err)
			return
		}
	}
}

// set stores the next version of the worker's j-th key and reads the reply.
func (w *worker) set(j int) error {
	w.sendSet(j)
	if err := w.wr.Flush(); err != nil {
		return err
	}
	return w.recvSet(j)
}

// sendSet puts the set of the next version of the worker's j-th key in
// the write buffer.
func (w *worker) sendSet(j int) {
	key := w.id + j*w.cfg.conns
	v := w.own[j] + 1
	w.own[j] = v
	w.sh.versions[key].Store(v)
	w.want = w.cfg.shape.appendValue(w.want[:0], key, v)

	b := append(w.line[:0], "set "...)
	b = append(b, w.sh.keyNames[key]...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(v), 10) // flags carry the version too
	b = append(b, " 0 "...)
	b = strconv.AppendInt(b, int64(len(w.want)), 10)
	b = append(b, crlf...)
	w.line = b
	w.wr.Write(b)
	w.wr.Write(w.want)
	w.wr.Write(crlf)
}

// recvSet reads the reply to the set of the worker's j-th key.
func (w *worker) recvSet(j int) error {
	key := w.id + j*w.cfg.conns
	line, err := w.readLine()
	if err != nil {
		return err
	}
	if bytes.Equal(line, lineStored) {
		return nil
	}
	w.exact[j] = false
	if isErrorReply(line) {
		w.countErrorReply(line)
		w.sh.report("conn %d: set %s: %q", w.id, w.sh.keyNames[key], line)
		return nil
	}
	return fmt.Errorf("set %s: unexpected reply %q: %w", w.sh.keyNames[key], line, errFraming)
}

// get asks for multiget distinct random keys and checks every VALUE.
func (w *worker) get() error {
	w.sendGet(&w.one)
	if err := w.wr.Flush(); err != nil {
		return err
	}
	return w.recvGet(&w.one)
}

// sendGet makes r a get of multiget distinct random keys and puts it in
// the write buffer.
func (w *worker) sendGet(r *request) {
	w.pickKeys(r)
	r.setKey = -1
	r.last = r.last[:0]
	for _, k := range r.keys {
		v := uint32(0)
		if k%w.cfg.conns == w.id {
			v = w.own[k/w.cfg.conns]
		}
		r.last = append(r.last, v)
	}
	b := append(w.line[:0], "get"...)
	for _, k := range r.keys {
		b = append(b, ' ')
		b = append(b, w.sh.keyNames[k]...)
	}
	b = append(b, crlf...)
	w.line = b
	w.wr.Write(b)
}

// recvGet reads the reply to get r and checks every VALUE.
func (w *worker) recvGet(r *request) error {
	next := 0 // hits come back in request order; skipped keys are misses
	for {
		line, err := w.readLine()
		if err != nil {
			return err
		}
		if bytes.Equal(line, lineEnd) {
			w.misses += uint64(len(r.keys) - next)
			return nil
		}
		if isErrorReply(line) {
			w.countErrorReply(line)
			w.sh.report("conn %d: get: %q", w.id, line)
			return nil
		}
		if !bytes.HasPrefix(line, lineValue) {
			return fmt.Errorf("get: unexpected reply %q: %w", line, errFraming)
		}
		key, flags, n, ok := parseValueLine(line)
		if !ok {
			return fmt.Errorf("get: bad VALUE line %q: %w", line, errFraming)
		}
		found := -1
		for i := next; i < len(r.keys); i++ {
			if bytes.Equal(w.sh.keyNames[r.keys[i]], key) {
				found = i
				break
			}
		}
		if found < 0 {
			// Not asked for, or out of order: the data still frames the
			// stream, so read past it and count the reply as wrong.
			w.wrong++
			w.sh.report("conn %d: get: VALUE for %q not asked for (or out of order)", w.id, key)
		}
		data, err := w.readData(n)
		if err != nil {
			return err
		}
		if found < 0 {
			continue
		}
		w.misses += uint64(found - next)
		w.hits++
		next = found + 1
		w.check(r.keys[found], flags, data, r.last[found])
	}
}

// pickKeys fills r's keys with distinct random key ids.
func (w *worker) pickKeys(r *request) {
	r.keys = r.keys[:0]
	for len(r.keys) < w.cfg.multiget {
		k := w.rng.IntN(w.cfg.keys)
		dup := false
		for _, o := range r.keys {
			if o == k {
				dup = true
				break
			}
		}
		if !dup {
			r.keys = append(r.keys, k)
		}
	}
}

// readLine returns the reply's next line, '\n' included, valid until the
// next read.
func (w *worker) readLine() ([]byte, error) {
	if !w.onLoop {
		return w.rd.ReadSlice('\n')
	}
	i := bytes.IndexByte(w.reply, '\n')
	if i < 0 {
		return nil, io.ErrUnexpectedEOF
	}
	line := w.reply[:i+1]
	w.reply = w.reply[i+1:]
	return line, nil
}

// readData returns a value's n bytes, without copying when they fit the
// read buffer; they stay valid until the next read.
func (w *worker) readData(n int) ([]byte, error) {
	var data []byte
	if w.onLoop {
		if len(w.reply) < n+2 {
			return nil, io.ErrUnexpectedEOF
		}
		data, w.reply = w.reply[:n+2], w.reply[n+2:]
	} else if n+2 <= w.rd.Size() {
		b, err := w.rd.Peek(n + 2)
		if err != nil {
			return nil, err
		}
		w.rd.Discard(n + 2)
		data = b
	} else {
		if cap(w.big) < n+2 {
			w.big = make([]byte, n+2)
		}
		data = w.big[:n+2]
		if _, err := io.ReadFull(w.rd, data); err != nil {
			return nil, err
		}
	}
	if !bytes.HasSuffix(data, crlf) {
		return nil, fmt.Errorf("get: data block not ended by CRLF: %w", errFraming)
	}
	return data[:n], nil
}

// check counts a value as wrong unless it is, byte for byte, a version of
// key that may be there now. Its flags name the version; a plain value
// names its key and version in its header as well. last is the version
// this connection had last stored of key, if key is its own, when it
// asked for it.
func (w *worker) check(key int, flags uint64, data []byte, last uint32) {
	var v uint32
	reason := ""
	if w.cfg.shapeName == shapePlain {
		hk, hv, ok := parseHeader(data, w.cfg.keyPrefix)
		switch {
		case !ok:
			reason = "no well-formed header"
		case hk != key:
			reason = fmt.Sprintf("header names key %d", hk)
		case flags != uint64(hv):
			reason = fmt.Sprintf("flags %d, version %d", flags, hv)
		}
		v = hv
	} else if flags > math.MaxUint32 {
		reason = fmt.Sprintf("flags %d name no version", flags)
	} else {
		v = uint32(flags)
	}
	if reason == "" {
		switch {
		case key%w.cfg.conns == w.id && w.exact[key/w.cfg.conns] && v != last:
			reason = fmt.Sprintf("version %d, last stored %d", v, last)
		case v < 1 || v > w.sh.versions[key].Load():
			// The owner publishes a version before it sends it, so anything
			// newer was never written.
			reason = fmt.Sprintf("version %d never stored", v)
		case !w.cfg.shape.isValue(data, key, v):
			reason = fmt.Sprintf("content differs from version %d", v)
		}
	}
	if reason != "" {
		w.wrong++
		w.sh.report("conn %d: wrong value for %s (%d bytes): %s", w.id, w.sh.keyNames[key], len(data), reason)
	}
}

func (w *worker) countErrorReply(line []byte) {
	if bytes.HasPrefix(line, lineServerError) {
		w.serverErrors++
	} else {
		w.errors++
	}
}

// isErrorReply reports whether line is one of memcached's error replies,
// which end a reply without breaking the stream.
func isErrorReply(line []byte) bool {
	return bytes.Equal(line, []byte("ERROR\r\n")) ||
		bytes.HasPrefix(line, []byte("CLIENT_ERROR ")) ||
		bytes.HasPrefix(line, lineServerError)
}

// parseValueLine splits "VALUE <key> <flags> <bytes> [<cas>]\r\n".
func parseValueLine(line []byte) (key []byte, flags uint64, n int, ok bool) {
	rest, ok := bytes.CutSuffix(line[len(lineValue):], crlf)
	if !ok {
		return nil, 0, 0, false
	}
	var f [4][]byte
	nf := 0
	for len(rest) > 0 && nf < len(f) {
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			i = len(rest)
		}
		f[nf] = rest[:i]
		nf++
		rest = rest[min(i+1, len(rest)):]
	}
	if nf < 3 || len(rest) > 0 {
		return nil, 0, 0, false
	}
	flags, ok1 := parseUint(f[1])
	size, ok2 := parseUint(f[2])
	if !ok1 || !ok2 || size > 1<<30 {
		return nil, 0, 0, false
	}
	return f[0], flags, int(size), true
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}
