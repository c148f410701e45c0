// Command loadgen drives memcached text-protocol load at one address over
// many connections, one request in flight on each, and checks every value
// it reads back byte for byte. It speaks the protocol by hand so that what
// it measures is the server, not a client library: it pre-populates the
// keys over buffered net.Conns, and runs the timed phase on event loops
// (see loop.go): against memcached they cost it about two thirds of the
// CPU per request that a goroutine per connection does, CPU it would
// otherwise take from the servers it shares the machine with.
//
// Every value is derived from its key, a version and the seed, and carries
// the key and version in a printable header, so any value read can be
// checked byte for byte. Each connection is the only writer of its own
// slice of the key space (key i belongs to connection i mod conns): for its
// own keys it expects exactly the version it last stored; for other keys it
// accepts any version their owner has begun to store.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"mcsidecar/proxy/evloop"
)

// config is the command's settings.
type config struct {
	addr      string
	conns     int
	duration  time.Duration
	requests  int64
	valueSize int
	getRatio  float64
	keys      int
	multiget  int
	seed      uint64
	keyPrefix string
	timeout   time.Duration
	waitStart time.Duration
	tls       bool
	loops     int

	pad []byte // what values' fillers are cut from: newPad(seed, valueSize)
}

func (c *config) registerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:11211", "memcached-protocol server to load: host:port")
	fs.IntVar(&c.conns, "conns", 32, "connections, each with one request in flight")
	fs.DurationVar(&c.duration, "duration", 0, "how long to run after pre-population (0: bounded by --requests only)")
	fs.Int64Var(&c.requests, "requests", 0, "total requests over all connections after pre-population (0: bounded by --duration only)")
	fs.IntVar(&c.valueSize, "value-size", 1024, "bytes per value")
	fs.Float64Var(&c.getRatio, "get-ratio", 0.9, "share of requests that are gets; the rest are sets")
	fs.IntVar(&c.keys, "keys", 10000, "size of the key space")
	fs.IntVar(&c.multiget, "multiget", 1, "distinct keys per get request")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the request mix and of the value contents")
	fs.StringVar(&c.keyPrefix, "key-prefix", "lg:", "prefix of every key (printable, no spaces)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "longest wait for connecting or for one reply")
	fs.IntVar(&c.loops, "event-loops", -1, "run the timed phase on this many event loops (-1: one per CPU); 0: a goroutine per connection, as always with --tls")
	fs.BoolVar(&c.tls, "tls", false, "speak TLS to the server, accepting any certificate (a load, not a check of the server's identity)")
	fs.DurationVar(&c.waitStart, "wait-start", 0, "after pre-population, print \"loadgen: populated\" on stderr and wait up to this long for SIGUSR1 before the timed phase, so that a harness can sample the server in between (0: start at once)")
}

// minValueSize leaves room for the longest header a value can carry.
const minValueSize = 48

func (c *config) validate() error {
	switch {
	case c.addr == "":
		return errors.New("--addr is empty")
	case c.conns < 1:
		return errors.New("--conns must be at least 1")
	case c.duration <= 0 && c.requests <= 0:
		return errors.New("set --duration or --requests: the run must be bounded")
	case c.duration < 0 || c.requests < 0:
		return errors.New("--duration and --requests must not be negative")
	case c.valueSize < minValueSize+len(c.keyPrefix) || c.valueSize > 1<<20:
		return fmt.Errorf("--value-size must be between %d and %d", minValueSize+len(c.keyPrefix), 1<<20)
	case c.getRatio < 0 || c.getRatio > 1 || math.IsNaN(c.getRatio):
		return errors.New("--get-ratio must be between 0 and 1")
	case c.keys < 1 || c.keys > math.MaxInt32:
		return errors.New("--keys must be at least 1")
	case c.multiget < 1 || c.multiget > c.keys:
		return errors.New("--multiget must be between 1 and --keys")
	case c.timeout <= 0:
		return errors.New("--timeout must be positive")
	case c.waitStart < 0:
		return errors.New("--wait-start must not be negative")
	case c.loops < -1 || c.loops > 256:
		return errors.New("--event-loops must be -1 (one per CPU) or between 0 and 256")
	}
	for _, b := range []byte(c.keyPrefix) {
		if b <= ' ' || b >= 0x7f {
			return errors.New("--key-prefix must be printable without spaces")
		}
	}
	if len(c.keyPrefix)+10 > 250 {
		return errors.New("--key-prefix is too long for a memcached key")
	}
	return nil
}

func main() {
	ok, err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run returns false when the server answered wrongly: a wrong value, a
// protocol error or a lost connection.
func run(args []string, stdout, stderr io.Writer) (bool, error) {
	var cfg config
	fs := pflag.NewFlagSet("loadgen", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.registerFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	if err := cfg.validate(); err != nil {
		return false, err
	}
	cfg.pad = newPad(cfg.seed, cfg.valueSize)
	sh := newShared(&cfg, stderr)
	workers := make([]*worker, cfg.conns)
	for i := range workers {
		w, err := newWorker(i, sh)
		if err != nil {
			for _, w := range workers[:i] {
				w.nc.Close()
			}
			return false, err
		}
		workers[i] = w
	}

	// Registered before anyone is told to send it: until then SIGUSR1
	// would end the process.
	var startSignal chan os.Signal
	if cfg.waitStart > 0 {
		startSignal = make(chan os.Signal, 1)
		signal.Notify(startSignal, syscall.SIGUSR1)
		defer signal.Stop(startSignal)
	}

	// Every key holds version 1 before the clock starts, so that a miss in
	// the timed phase means the server lost or evicted a value.
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(w.populate)
	}
	wg.Wait()

	var loops *loopDriver
	if n := cfg.loops; n != 0 && !cfg.tls {
		if n < 0 {
			n = runtime.GOMAXPROCS(0)
		}
		var err error
		if loops, err = startLoops(sh, workers, n); err != nil {
			for _, w := range workers {
				w.nc.Close()
			}
			return false, err
		}
		defer loops.stop()
	}

	if startSignal != nil {
		fmt.Fprintln(stderr, "loadgen: populated, waiting for SIGUSR1")
		select {
		case <-startSignal:
		case <-time.After(cfg.waitStart):
			for _, w := range workers {
				w.nc.Close()
			}
			return false, fmt.Errorf("no SIGUSR1 within --wait-start %s", cfg.waitStart)
		}
	}

	cpu0 := cpuTime()
	start := time.Now()
	sh.end = start.Add(cfg.duration)
	if loops != nil {
		loops.run()
	} else {
		for _, w := range workers {
			wg.Go(w.loop)
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0

	var total counters
	for _, w := range workers {
		w.nc.Close()
		total.add(&w.counters)
	}
	fmt.Fprintf(stdout, "requests=%d ops/s=%.1f gets=%d hits=%d misses=%d sets=%d errors=%d server_errors=%d wrong=%d p50=%s p99=%s elapsed=%.2fs conns=%d multiget=%d loadgen_cpu=%.2fs\n",
		total.requests, float64(total.requests)/elapsed.Seconds(), total.gets, total.hits, total.misses, total.sets,
		total.errors, total.serverErrors, total.wrong, micros(total.latency.quantile(0.50)), micros(total.latency.quantile(0.99)),
		elapsed.Seconds(), cfg.conns, cfg.multiget, cpu.Seconds())
	return total.errors == 0 && total.wrong == 0, nil
}

func micros(ns uint64) string { return strconv.FormatFloat(float64(ns)/1e3, 'f', 1, 64) + "us" }

// cpuTime is the user and system time this process has used so far, to
// show how much of the machine the load generator itself takes.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// shared is what all connections read: the settings, the key names, and
// the version each key's owner has last begun to store.
type shared struct {
	cfg      *config
	keyNames [][]byte
	versions []atomic.Uint32
	claimed  atomic.Int64 // requests started, against --requests
	end      time.Time    // set before the timed phase begins

	logMu  sync.Mutex
	logged int
	log    io.Writer
}

func newShared(cfg *config, log io.Writer) *shared {
	sh := &shared{cfg: cfg, keyNames: make([][]byte, cfg.keys), versions: make([]atomic.Uint32, cfg.keys), log: log}
	for i := range sh.keyNames {
		sh.keyNames[i] = strconv.AppendInt([]byte(cfg.keyPrefix), int64(i), 10)
	}
	return sh
}

// report prints the first few failures in detail; the counters carry the rest.
func (sh *shared) report(format string, args ...any) {
	sh.logMu.Lock()
	defer sh.logMu.Unlock()
	if sh.logged++; sh.logged <= 10 {
		fmt.Fprintf(sh.log, "loadgen: "+format+"\n", args...)
	}
}

// counters is one connection's tally, summed at the end. errors are
// failures of the protocol itself (I/O errors, replies that break framing,
// ERROR and CLIENT_ERROR to well-formed requests) and fail the run;
// serverErrors are SERVER_ERROR replies, a server's well-formed way of
// saying it could not serve a request (out of memory, upstream timeout), and
// are only counted.
type counters struct {
	requests, gets, hits, misses, sets, errors, serverErrors, wrong uint64
	latency                                                         histogram
}

func (c *counters) add(o *counters) {
	c.requests += o.requests
	c.gets += o.gets
	c.hits += o.hits
	c.misses += o.misses
	c.sets += o.sets
	c.errors += o.errors
	c.serverErrors += o.serverErrors
	c.wrong += o.wrong
	c.latency.merge(&o.latency)
}

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

	dead       bool  // the connection was given up
	req        []int // key ids of the get in flight
	line       []byte
	want       []byte
	big        []byte
	renewAfter time.Time
	counters

	// On an event loop (see loop.go): the connection, the request being
	// written and the reply being read, the request in flight (setKey is
	// the owned key a set stores, -1 for a get) and when it was sent.
	onLoop             bool
	gc                 *evloop.Conn
	out                outBuf
	reply              []byte // the rest of the reply being read
	inFlight, finished bool
	setKey             int
	scan               replyScan
	acc                []byte // a reply read in pieces
	began              time.Time
	sentAt             atomic.Int64 // unix nanoseconds, 0 when nothing is in flight; read by the timeout watch
	timedOut           atomic.Bool
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
		req:   make([]int, 0, cfg.multiget),
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
		if len(w.own) == 0 || w.rng.Float64() < cfg.getRatio {
			err = w.get()
			w.gets++
		} else {
			err = w.set(w.rng.IntN(len(w.own)))
			w.sets++
		}
		w.requests++
		w.latency.record(uint64(time.Since(start)))
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
	w.want = appendValue(w.want[:0], w.cfg, key, v)

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
	w.sendGet()
	if err := w.wr.Flush(); err != nil {
		return err
	}
	return w.recvGet()
}

// sendGet puts a get of multiget distinct random keys in the write buffer.
func (w *worker) sendGet() {
	w.pickKeys()
	b := append(w.line[:0], "get"...)
	for _, k := range w.req {
		b = append(b, ' ')
		b = append(b, w.sh.keyNames[k]...)
	}
	b = append(b, crlf...)
	w.line = b
	w.wr.Write(b)
}

// recvGet reads the reply to the get in flight and checks every VALUE.
func (w *worker) recvGet() error {
	next := 0 // hits come back in request order; skipped keys are misses
	for {
		line, err := w.readLine()
		if err != nil {
			return err
		}
		if bytes.Equal(line, lineEnd) {
			w.misses += uint64(len(w.req) - next)
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
		for i := next; i < len(w.req); i++ {
			if bytes.Equal(w.sh.keyNames[w.req[i]], key) {
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
		w.check(w.req[found], flags, data)
	}
}

// pickKeys fills req with distinct random key ids.
func (w *worker) pickKeys() {
	w.req = w.req[:0]
	for len(w.req) < w.cfg.multiget {
		k := w.rng.IntN(w.cfg.keys)
		dup := false
		for _, o := range w.req {
			if o == k {
				dup = true
				break
			}
		}
		if !dup {
			w.req = append(w.req, k)
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
// key that may be there now.
func (w *worker) check(key int, flags uint64, data []byte) {
	hk, v, ok := parseHeader(data, w.cfg.keyPrefix)
	reason := ""
	switch {
	case !ok:
		reason = "no well-formed header"
	case hk != key:
		reason = fmt.Sprintf("header names key %d", hk)
	case flags != uint64(v):
		reason = fmt.Sprintf("flags %d, version %d", flags, v)
	case key%w.cfg.conns == w.id && w.exact[key/w.cfg.conns] && v != w.own[key/w.cfg.conns]:
		reason = fmt.Sprintf("version %d, last stored %d", v, w.own[key/w.cfg.conns])
	case v < 1 || v > w.sh.versions[key].Load():
		// The owner publishes a version before it sends it, so anything
		// newer was never written.
		reason = fmt.Sprintf("version %d never stored", v)
	default:
		if !isValue(data, w.cfg, key, v) {
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

// appendValue appends version v of key's value: a printable header naming
// both, then a filler cut from cfg.pad at a place chosen by seed, key and
// version. The filler is raw binary and so contains CR and LF, which keeps
// servers honest about framing by length.
func appendValue(dst []byte, cfg *config, key int, v uint32) []byte {
	n := len(dst)
	dst = appendHeader(dst, cfg, key, v)
	return append(dst, filler(cfg, key, v, cfg.valueSize-(len(dst)-n))...)
}

// appendHeader appends the printable header of version v of key's value.
func appendHeader(dst []byte, cfg *config, key int, v uint32) []byte {
	dst = append(dst, cfg.keyPrefix...)
	dst = strconv.AppendInt(dst, int64(key), 10)
	dst = append(dst, '|', 'v')
	dst = strconv.AppendUint(dst, uint64(v), 10)
	return append(dst, '|')
}

// padSpan is the number of places in the pad a filler may start at.
const padSpan = 1 << 16

// newPad returns the bytes every filler is cut from: random bytes from a
// generator seeded by seed, padSpan more than the longest filler. Cutting
// fillers from one pad rather than generating each keeps checking a value
// down to a comparison of memory, so that loadgen, which shares the
// machine with the servers it measures, takes little CPU from them even
// when every get brings back hundreds of KiB.
func newPad(seed uint64, valueSize int) []byte {
	pad := make([]byte, valueSize+padSpan)
	s := seed
	for i := 0; i < len(pad); i += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], splitmix(&s))
		copy(pad[i:], b[:])
	}
	return pad
}

// filler returns the n filler bytes of version v of key's value.
func filler(cfg *config, key int, v uint32, n int) []byte {
	s := cfg.seed ^ uint64(key)<<32 ^ uint64(v)*0x9e3779b97f4a7c15
	off := int(splitmix(&s) % padSpan)
	return cfg.pad[off : off+n]
}

// isValue reports whether data is version v of key's value, as
// appendValue would write it.
func isValue(data []byte, cfg *config, key int, v uint32) bool {
	if len(data) != cfg.valueSize {
		return false
	}
	var hb [64]byte
	h := appendHeader(hb[:0], cfg, key, v)
	return bytes.HasPrefix(data, h) && bytes.Equal(data[len(h):], filler(cfg, key, v, len(data)-len(h)))
}

func splitmix(s *uint64) uint64 {
	*s += 0x9e3779b97f4a7c15
	z := *s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// parseHeader reads the key id and version from a value's header.
func parseHeader(data []byte, prefix string) (key int, v uint32, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(prefix))
	if !ok {
		return 0, 0, false
	}
	i := bytes.IndexByte(rest, '|')
	if i < 0 || i+2 > len(rest) || rest[i+1] != 'v' {
		return 0, 0, false
	}
	k, ok1 := parseUint(rest[:i])
	rest = rest[i+2:]
	j := bytes.IndexByte(rest, '|')
	if j < 0 {
		return 0, 0, false
	}
	ver, ok2 := parseUint(rest[:j])
	if !ok1 || !ok2 || k > math.MaxInt32 || ver > math.MaxUint32 {
		return 0, 0, false
	}
	return int(k), uint32(ver), true
}

// histogram counts latencies in nanoseconds in log-linear buckets: 64 per
// power of two, so a quantile is off by under 1.6% while a connection's
// histogram stays a fixed 30 KiB however long the run.
type histogram struct {
	counts [(64 - subBits + 1) << subBits]uint64
	total  uint64
}

const subBits = 6

func bucketOf(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1
	return (e+1)<<subBits + int(v>>e) - 1<<subBits
}

// bucketMid is the middle of a bucket's range, the value a quantile reports.
func bucketMid(i int) uint64 {
	if i < 1<<subBits {
		return uint64(i)
	}
	e := i>>subBits - 1
	m := uint64(i&(1<<subBits-1) + 1<<subBits)
	return m<<e + (uint64(1)<<e)/2
}

func (h *histogram) record(ns uint64) {
	h.counts[bucketOf(ns)]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, n := range o.counts {
		h.counts[i] += n
	}
	h.total += o.total
}

func (h *histogram) quantile(q float64) uint64 {
	if h.total == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(h.total)))
	var seen uint64
	for i, n := range h.counts {
		seen += n
		if seen >= target && n > 0 {
			return bucketMid(i)
		}
	}
	return 0
}
