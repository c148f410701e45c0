// Command loadgen drives memcached text-protocol load at one address over
// many connections, one request in flight on each (or, with --rate, each
// request sent when it is due: see pace.go), and checks every value it
// reads back byte for byte. It speaks the protocol by hand so that what
// it measures is the server, not a client library: it pre-populates the
// keys over buffered net.Conns, and runs the timed phase on event loops
// (see loop.go): against memcached they cost it about two thirds of the
// CPU per request that a goroutine per connection does, CPU it would
// otherwise take from the servers it shares the machine with.
//
// Every value is derived from its key, a version and the seed, and is
// stored with the version as its flags, so any value read can be checked
// byte for byte. Keys and values come in shapes (--shape, see shapes.go):
// loadgen's own plain values name their key and version in a printable
// header; the others are shaped like a Mimir store-gateway's postings and
// series entries, 150-byte tenant in the key and all. Each connection is
// the only writer of its own slice of the key space (key i belongs to
// connection i mod conns): for its own keys it expects exactly the version
// it last stored; for other keys it accepts any version their owner has
// begun to store.
package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"
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
	shapeName string
	rate      float64

	// plainFlag is a flag of the plain shape's alone that was given
	// (--value-size, --key-prefix), "" if none: the other shapes size and
	// name their own values and keys.
	plainFlag string

	pad   []byte // what plain values' fillers are cut from: newPad(seed, valueSize)
	shape shape  // newShape(cfg)
}

func (c *config) registerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:11211", "memcached-protocol server to load: host:port")
	fs.IntVar(&c.conns, "conns", 32, "connections, each with one request in flight (with --rate, as many as are due)")
	fs.DurationVar(&c.duration, "duration", 0, "how long to run after pre-population (0: bounded by --requests only)")
	fs.Int64Var(&c.requests, "requests", 0, "total requests over all connections after pre-population (0: bounded by --duration only)")
	fs.IntVar(&c.valueSize, "value-size", 1024, "bytes per value (--shape plain)")
	fs.Float64Var(&c.getRatio, "get-ratio", 0.9, "share of requests that are gets; the rest are sets")
	fs.IntVar(&c.keys, "keys", 10000, "size of the key space")
	fs.IntVar(&c.multiget, "multiget", 1, "distinct keys per get request")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the request mix and of the value contents")
	fs.StringVar(&c.keyPrefix, "key-prefix", "lg:", "prefix of every key (printable, no spaces; --shape plain)")
	fs.StringVar(&c.shapeName, "shape", shapePlain, "what keys and values look like: plain (--key-prefix and a number, values of --value-size bytes naming their key), or shaped like a Mimir store-gateway's: dm (postings keys of 224 bytes, Mimir \"dm\" postings values of about 3 KB), raw-postings (the same keys, raw postings lists of 10-50,000 uint32 references, about 23 KB on average), series (series keys, values of a few hundred bytes)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "longest wait for connecting or for one reply")
	fs.IntVar(&c.loops, "event-loops", -1, "run the timed phase on this many event loops (-1: one per CPU); 0: a goroutine per connection, as always with --tls")
	fs.BoolVar(&c.tls, "tls", false, "speak TLS to the server, accepting any certificate (a load, not a check of the server's identity)")
	fs.Float64Var(&c.rate, "rate", 0, "open loop: send this many requests per second over all connections, each when it is due whether or not earlier replies have come, and measure latency from when it was due; requests sent over 1ms late are counted (late=); 0: closed loop, each connection sending its next request when the reply to the last is in")
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
	case !slices.Contains(shapeNames, c.shapeName):
		return fmt.Errorf("--shape must be one of %s", strings.Join(shapeNames, ", "))
	case c.rate < 0 || math.IsNaN(c.rate) || math.IsInf(c.rate, 0):
		return errors.New("--rate must be a number of requests per second, 0 for a closed loop")
	case c.rate > 0 && (c.tls || c.loops == 0):
		return errors.New("--rate runs on the event loops only: not with --tls or --event-loops 0")
	case c.shapeName != shapePlain && c.plainFlag != "":
		return fmt.Errorf("--%s is for --shape plain: shape %s sizes and names its own values and keys", c.plainFlag, c.shapeName)
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
	for _, name := range []string{"value-size", "key-prefix"} {
		if fs.Changed(name) && cfg.plainFlag == "" {
			cfg.plainFlag = name
		}
	}
	if err := cfg.validate(); err != nil {
		return false, err
	}
	cfg.pad = newPad(cfg.seed, cfg.valueSize)
	cfg.shape = newShape(&cfg)
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
	sh.start, sh.end = start, start.Add(cfg.duration)
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
	// items/s counts the values that went over the wire, read (hits) or
	// written (sets); batch_p50 and batch_p99 are the gets' latencies alone,
	// a get of --multiget keys being the batch a store-gateway sends.
	fmt.Fprintf(stdout, "requests=%d ops/s=%.1f items/s=%.1f gets=%d hits=%d misses=%d sets=%d errors=%d server_errors=%d wrong=%d p50=%s p99=%s batch_p50=%s batch_p99=%s late=%d elapsed=%.2fs conns=%d multiget=%d shape=%s rate=%g loadgen_cpu=%.2fs\n",
		total.requests, float64(total.requests)/elapsed.Seconds(), float64(total.hits+total.sets)/elapsed.Seconds(),
		total.gets, total.hits, total.misses, total.sets,
		total.errors, total.serverErrors, total.wrong, micros(total.latency.quantile(0.50)), micros(total.latency.quantile(0.99)),
		micros(total.batch.quantile(0.50)), micros(total.batch.quantile(0.99)), total.late,
		elapsed.Seconds(), cfg.conns, cfg.multiget, cfg.shapeName, cfg.rate, cpu.Seconds())
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
	start    time.Time    // set before the timed phase begins
	end      time.Time    // start + duration

	logMu  sync.Mutex
	logged int
	log    io.Writer
}

func newShared(cfg *config, log io.Writer) *shared {
	sh := &shared{cfg: cfg, keyNames: make([][]byte, cfg.keys), versions: make([]atomic.Uint32, cfg.keys), log: log}
	for i := range sh.keyNames {
		sh.keyNames[i] = cfg.shape.appendKey(nil, i)
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
	late                                                            uint64 // sent over lateAfter after due, in an open loop
	latency                                                         histogram
	batch                                                           histogram // of the gets alone
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
	c.late += o.late
	c.latency.merge(&o.latency)
	c.batch.merge(&o.batch)
}

// record counts a request's latency, and a get's as a batch's too.
func (c *counters) record(ns uint64, get bool) {
	c.latency.record(ns)
	if get {
		c.batch.record(ns)
	}
}
