package proxy

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// faultKind is one way the fault forwarder damages what it relays.
type faultKind int

const (
	// faultDelay pauses before reply bytes go out (per write).
	faultDelay faultKind = iota
	// faultSplit writes reply bytes a few at a time (per write).
	faultSplit
	// faultTruncate writes part of the reply bytes, then closes both
	// sides, half the time with a reset (per write).
	faultTruncate
	// faultCloseAfterRequest forwards request bytes, lets memcached
	// apply them, and closes both sides before any reply to them is
	// relayed: a server that applied a batch and went away (per read of
	// request bytes).
	faultCloseAfterRequest
	// faultCorrupt replaces one byte of a reply segment by faultMark.
	faultCorrupt
	// faultDuplicate writes a run of bytes inside a reply segment twice.
	faultDuplicate
	// faultDrop leaves out a run of bytes inside a reply line.
	faultDrop
	numFaultKinds
)

var faultNames = [numFaultKinds]string{"delay", "split", "truncate", "close-after-request", "corrupt", "duplicate", "drop"}

// faultMark is the byte a corruption writes. No key, value or reply of the
// tests holds it, so a client that reads it knows the forwarder wrote it,
// and the rest of what it read must still be its own.
const faultMark = '~'

// faultConfig is what a fault forwarder injects: each kind's chance, per
// the unit its comment names, and the range of a delay. A reply segment,
// the unit of the faults that change bytes, is one reply line, or the
// bytes a VALUE line announces with their CRLF.
//
// The faults that change bytes stay where a proxy that checks each reply
// against its request can see them. A run is duplicated or dropped only
// strictly inside one segment, never a whole line: a line dropped or
// repeated whole shifts the replies after it, and a reply cannot be told
// from another of the same kind. (The end of NOT_STORED repeated makes an
// extra STORED line, and NOT_STORED without its start reads STORED: so
// storage replies may still shift, but only among storage commands, the
// only ones a STORED fits.) Never inside a line with a digit either: one
// digit fewer is another number, and a longer size in a VALUE line makes
// the value take in the replies after it, which may end where its CRLF is
// due. A value's bytes are corrupted or duplicated (too long for its
// size, its CRLF is not where due) but never dropped: the bytes after it
// would fill it up.
type faultConfig struct {
	rates              [numFaultKinds]float64
	minDelay, maxDelay time.Duration
}

// faultForwarder relays each connection made to addr to a real memcached
// and damages it as its config says, with a random source per connection
// seeded from its seed and the connection's number: the same seed damages
// the same way, as far as the timing of TCP reads allows. It stops when
// the test ends.
type faultForwarder struct {
	addr   string
	target string
	seed   uint64
	cfg    faultConfig
	conns  atomic.Uint64
	// injected counts the faults injected, by kind; oom counts the
	// "SERVER_ERROR out of memory" lines memcached sent.
	injected [numFaultKinds]atomic.Int64
	oom      atomic.Int64
}

// startFaultForwarder serves a fault forwarder to the memcached at target
// on a free loopback port until the test ends.
func startFaultForwarder(tb testing.TB, target string, seed uint64, cfg faultConfig) *faultForwarder {
	tb.Helper()
	f := &faultForwarder{target: target, seed: seed, cfg: cfg}
	f.addr, _ = fakeUpstream(tb, f.serve)
	return f
}

// serve relays one connection: requests from the proxy as they come,
// replies from memcached through the faults. When either side ends,
// both connections close.
func (f *faultForwarder) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", f.target, time.Second)
	if err != nil {
		return
	}
	n := f.conns.Add(1)
	var cut atomic.Bool // set once no more reply bytes may be relayed
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.relayRequests(client, server, rand.New(rand.NewPCG(f.seed, n<<1)), &cut)
		client.Close()
		server.Close()
	}()
	f.relayReplies(client, server, rand.New(rand.NewPCG(f.seed, n<<1|1)), &cut)
	client.Close()
	server.Close()
	<-done
}

func (f *faultForwarder) hit(rng *rand.Rand, k faultKind) bool {
	if f.cfg.rates[k] > 0 && rng.Float64() < f.cfg.rates[k] {
		f.injected[k].Add(1)
		return true
	}
	return false
}

// relayRequests copies request bytes to memcached until either side ends,
// or until a close after a request: cut is set before the request goes
// out, so no reply to it is relayed, and memcached is given a moment to
// apply it before both sides close.
func (f *faultForwarder) relayRequests(client, server net.Conn, rng *rand.Rand, cut *atomic.Bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			closing := f.hit(rng, faultCloseAfterRequest)
			if closing {
				cut.Store(true)
			}
			if _, werr := server.Write(buf[:n]); werr != nil || closing {
				if closing {
					time.Sleep(5 * time.Millisecond)
				}
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// relayReplies reads memcached's replies segment by segment, damages
// them, and writes what memcached sent at once in one write (or several,
// when split), until either side ends or a fault closes both.
func (f *faultForwarder) relayReplies(client, server net.Conn, rng *rand.Rand, cut *atomic.Bool) {
	br := bufio.NewReaderSize(server, 64<<10)
	var out []byte
	value := 0 // bytes of a value block still to come, with their CRLF
	for {
		seg, isValue, err := nextSegment(br, &value)
		if bytes.HasPrefix(seg, []byte("SERVER_ERROR out of memory")) {
			f.oom.Add(1)
		}
		out = f.damage(out, seg, isValue, rng)
		if err == nil && br.Buffered() > 0 && len(out) < 256<<10 {
			continue // more of what memcached sent at once
		}
		if len(out) > 0 && !f.send(client, out, rng, cut) {
			return
		}
		out = out[:0]
		if err != nil {
			return
		}
	}
}

// nextSegment reads the next reply segment: the value block a VALUE line
// announced (value bytes of it), or a line.
func nextSegment(br *bufio.Reader, value *int) (seg []byte, isValue bool, err error) {
	if *value > 0 {
		seg = make([]byte, *value)
		n, err := io.ReadFull(br, seg)
		*value = 0
		return seg[:n], true, err
	}
	seg, err = br.ReadBytes('\n')
	if err == nil && bytes.HasPrefix(seg, []byte("VALUE ")) {
		if f := bytes.Fields(seg); len(f) >= 4 {
			if size, perr := strconv.Atoi(string(f[3])); perr == nil && size >= 0 {
				*value = size + 2
			}
		}
	}
	return seg, false, err
}

// damage appends seg to out, damaged as the faults that change bytes
// draw. It keeps to the places faultConfig describes.
func (f *faultForwarder) damage(out, seg []byte, isValue bool, rng *rand.Rand) []byte {
	if len(seg) == 0 {
		return out
	}
	// A line with a digit in it (a number, a VALUE line, a version) is
	// only corrupted: a run dropped or repeated there could make another
	// valid number or size.
	fragile := !isValue && bytes.ContainsAny(seg, "0123456789")
	start := len(out)
	out = append(out, seg...)
	if f.hit(rng, faultCorrupt) {
		out[start+rng.IntN(len(seg))] = faultMark
	}
	seg = out[start:]
	switch {
	case len(seg) < 2 || fragile:
	case f.hit(rng, faultDuplicate):
		a, b := innerRun(rng, len(seg))
		out = append(out[:start+b], append(bytes.Clone(seg[a:b]), seg[b:]...)...)
	case !isValue && f.hit(rng, faultDrop):
		a, b := innerRun(rng, len(seg))
		out = append(out[:start+a], seg[b:]...)
	}
	return out
}

// innerRun draws a run [a, b) of up to 16 bytes strictly inside n bytes.
func innerRun(rng *rand.Rand, n int) (a, b int) {
	l := 1 + rng.IntN(min(n-1, 16))
	a = rng.IntN(n - l + 1)
	return a, a + l
}

// send writes out to the proxy through the delay, truncate and split
// faults. It returns false once the connection is to close: after a
// truncation, or when a close after a request forbids relaying more.
func (f *faultForwarder) send(client net.Conn, out []byte, rng *rand.Rand, cut *atomic.Bool) bool {
	if f.hit(rng, faultDelay) {
		d := f.cfg.minDelay
		if span := f.cfg.maxDelay - f.cfg.minDelay; span > 0 {
			d += time.Duration(rng.Int64N(int64(span)))
		}
		time.Sleep(d)
	}
	if cut.Load() {
		return false
	}
	if f.hit(rng, faultTruncate) {
		client.Write(out[:rng.IntN(len(out))])
		if rng.IntN(2) == 0 {
			client.(*net.TCPConn).SetLinger(0) // a reset, not a close
		}
		return false
	}
	if f.hit(rng, faultSplit) {
		for len(out) > 0 {
			n := min(len(out), 1+rng.IntN(16))
			if _, err := client.Write(out[:n]); err != nil {
				return false
			}
			out = out[n:]
		}
		return true
	}
	_, err := client.Write(out)
	return err == nil
}
