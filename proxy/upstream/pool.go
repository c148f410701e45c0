package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"mcsidecar/proxy/internal/sockio"
	"mcsidecar/proxy/internal/wire"
)

// rawPool holds the connections to one server. Every request to it goes
// out on them, in the batches its coalescer gathers (exchange), plus
// flush_all, the version of readiness checks and probes, and the meta
// commands of an envelope's read-modify-write. One deadline bounds a whole
// batch, so a server that trickles its reply is still timed out, and
// values are read straight into their callers' reused buffers.
//
// Not gomemcache: it takes one connection per request, so requests of many
// clients never share a write or a read; it has no multi-key gat, no gats
// and no meta commands; its GetMulti renews the deadline before every reply
// line, starts a goroutine and builds a map per call, and allocates every
// value.
type rawPool struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout        time.Duration
	connectTimeout time.Duration
	maxIdle        int
	health         *health
	// outOfStep counts and logs a connection found out of step.
	outOfStep func(error)

	mu     sync.Mutex
	idle   []*rawConn
	closed bool
}

// upstreamReadSize is the read buffer of an upstream connection: large
// enough that the reply to a multi-get of many values arrives in few reads
// (a value larger than it is read straight into place). Only connections
// in use or idle hold one, a few per server.
const upstreamReadSize = 64 << 10

type rawConn struct {
	nc    net.Conn
	rw    *bufio.ReadWriter
	src   *sendFirst // under rw's reader
	out   []byte     // a batch of requests being gathered
	lines []int      // how many retrieval lines each run of gets of it has
	used  time.Time  // when its last use began
}

// staleAfter is how long a pooled connection sits unused before get looks
// whether the server closed it meanwhile. A busy connection, reused
// within microseconds, costs no system call for the look; a restart takes
// far longer, so after one every connection the pool kept is found closed
// before a request is written on it.
const staleAfter = time.Millisecond

// sendFirst reads an upstream connection for its bufio.Reader. A batch of
// requests handed to it is written as the first read begins, inside the
// wait for the socket to become readable: the read then happens once the
// replies are there. Writing first and reading after would cost one more
// read, which finds the socket empty while the server is still answering.
type sendFirst struct {
	nc  net.Conn
	rc  syscall.RawConn // nil: not a plain socket; write, then read
	out []byte          // to write before the next read; nil: none
	w   *sockio.Writer  // writeNow's writes, with rc

	// The read in progress, for onReadable: kept here, with the callback
	// made once, so that a read allocates nothing.
	turn func(fd uintptr) bool
	p    []byte
	n    int
	err  error
	sent bool

	// got counts the bytes read since the connection's current use
	// began: none means no reply had begun to arrive when it failed.
	got int
}

func newSendFirst(nc net.Conn) *sendFirst {
	s := &sendFirst{nc: nc, rc: sockio.RawConnOf(nc)}
	s.turn = s.onReadable
	if s.rc != nil {
		s.w = sockio.NewWriter(s.rc)
	}
	return s
}

func (s *sendFirst) Read(p []byte) (int, error) {
	if s.rc == nil {
		if err := s.writeNow(); err != nil {
			return 0, err
		}
		n, err := s.nc.Read(p)
		s.got += n
		return n, err
	}
	s.p, s.n, s.err, s.sent = p, 0, nil, s.out == nil
	err := s.rc.Read(s.turn)
	s.p, s.out = nil, nil
	if s.err != nil {
		return 0, s.err
	}
	if err != nil {
		return 0, err
	}
	s.got += s.n
	return s.n, nil
}

// onReadable is the callback of the wait. Its first call writes the batch
// (the wait has begun: no readiness the replies raise is lost) and waits;
// later ones read.
func (s *sendFirst) onReadable(fd uintptr) bool {
	if !s.sent {
		s.sent = true
		s.err = s.writeNow()
		return s.err != nil
	}
	n, again, err := sockio.Read(int(fd), s.p)
	if again {
		return false
	}
	s.n, s.err = n, err
	return true
}

// writeNow writes the batch: at once, or as the first read begins. A
// batch larger than the socket's send buffer waits for room.
func (s *sendFirst) writeNow() error {
	out := s.out
	s.out = nil
	if out == nil {
		return nil
	}
	if s.rc == nil {
		_, err := s.nc.Write(out)
		return err
	}
	_, err := s.w.WriteOne(out)
	return err
}

var errUnexpectedReply = errors.New("unexpected reply from upstream")

// do runs fn as try does, under the server's health.
func (p *rawPool) do(idempotent bool, fn func(*rawConn) error) error {
	return p.guard(func() error { return p.try(idempotent, fn) })
}

// guard sends a request unless the server is ejected, and counts the
// result towards ejecting it.
func (p *rawPool) guard(send func() error) error {
	if err := p.health.admit(); err != nil {
		return err
	}
	return p.health.observe(send())
}

// once runs fn as try does, and never a second time: for a request that
// must not be repeated.
func (p *rawPool) once(fn func(*rawConn) error) error { return p.try(false, fn) }

// try runs fn on a pooled connection under one deadline. The connection is
// kept only if fn succeeded. When a connection taken from the idle pool
// fails other than by timing out, the server has most likely restarted
// since get looked at the connection: every idle connection is dropped.
// fn then runs once more, on a new connection, only if idempotent says
// its request may be applied twice and no byte of a reply had arrived.
// Any other request fails: memcached may have applied it before the
// connection broke, and an incr sent again would count twice.
func (p *rawPool) try(idempotent bool, fn func(*rawConn) error) error {
	c, reused, err := p.get()
	if err != nil {
		return err
	}
	err = p.run(c, fn)
	if err != nil && reused && !IsTimeout(err) && !IsOutOfStep(err) {
		p.dropIdle()
		if !idempotent || c.src.got > 0 {
			return err
		}
		if c, _, err = p.get(); err != nil {
			return err
		}
		err = p.run(c, fn)
	}
	return err
}

// get returns an idle connection, or a new one. An idle connection unused
// for staleAfter is looked at first: when the server closed it meanwhile
// (it restarted, or its idle timeout ran out), it is not used, nor is any
// other idle one, and a new connection is made before anything is
// written. A request that fails on a connection get hands out may have
// been applied; one never written can be sent anywhere.
func (p *rawPool) get() (c *rawConn, reused bool, err error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c != nil {
		if time.Since(c.used) < staleAfter || sockio.Quiet(c.nc) {
			return c, true, nil
		}
		c.nc.Close()
		p.dropIdle()
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(p.connectTimeout, p.timeout))
	defer cancel()
	nc, err := p.dial(ctx, "", "")
	if err != nil {
		return nil, false, err
	}
	src := newSendFirst(nc)
	return &rawConn{nc: nc, src: src, rw: bufio.NewReadWriter(bufio.NewReaderSize(src, upstreamReadSize), bufio.NewWriterSize(nc, 4<<10))}, false, nil
}

// run runs fn on c under one deadline and pools c again if fn succeeded.
func (p *rawPool) run(c *rawConn, fn func(*rawConn) error) error {
	c.begin(time.Now(), p.timeout)
	if err := fn(c); err != nil {
		p.closeOn(c, err)
		return err
	}
	p.put(c)
	return nil
}

// closeOn closes c, which failed with err: a connection out of step is
// never read on, and is counted.
func (p *rawPool) closeOn(c *rawConn, err error) {
	c.nc.Close()
	if p.outOfStep != nil && IsOutOfStep(err) {
		p.outOfStep(err)
	}
}

// begin starts a use of c at now: its deadline, and its count of bytes
// read from zero.
func (c *rawConn) begin(now time.Time, timeout time.Duration) {
	c.nc.SetDeadline(now.Add(timeout))
	c.used = now
	c.src.got = 0
}

// put pools c again, or closes it when the pool is full or closed.
func (p *rawPool) put(c *rawConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// dropIdle closes every idle connection.
func (p *rawPool) dropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

func (p *rawPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.idle {
		c.nc.Close()
	}
	p.idle = nil
}

// lineMax is the longest non-get line memcached reads in pieces: with more
// than this buffered and no newline it hangs up, so a long gats is split
// into several pipelined lines no longer than this.
const lineMax = 2048

// exchange sends the work of every call in batch in one write and reads
// the replies in the same order (prepare, receive). A batch of retrievals
// alone may be sent again (see try); a retry starts over: the calls are
// emptied first.
func (p *rawPool) exchange(r Retrieval, batch []*Call) error {
	return p.do(retrievalsOnly(batch), func(c *rawConn) error {
		c.prepare(r, batch)
		return c.receive(r, batch)
	})
}

// retrievalsOnly reports whether batch holds gets alone (gets, gats or
// mg for their keys, as prepare asks for them): reading an item twice
// changes nothing a client can tell, so the batch is safe to repeat. A
// gats sent again sets the same time to live once more. A command is not:
// memcached may have applied it, and a storage command, delete, touch,
// incr or decr applied twice can change the item or its answer.
func retrievalsOnly(batch []*Call) bool { return gets(batch, 0) == len(batch) }

// pending is a batch that send wrote, whose replies are still to be read.
type pending struct {
	c      *rawConn // nil when nothing was sent
	reused bool
	sent   time.Time
	err    error
}

// send starts an exchange without waiting for its replies, for a request
// with batches for other servers to write before it reads any reply: it
// takes a connection and gathers batch on it, to be written by writeNow
// or as finish begins to read. finish completes it. Health, deadline and
// the retry of retrievals on a broken pooled connection are as in
// exchange.
func (p *rawPool) send(r Retrieval, batch []*Call) pending {
	if err := p.health.admit(); err != nil {
		return pending{err: err}
	}
	c, reused, err := p.get()
	if err != nil {
		return pending{err: err}
	}
	at := time.Now()
	c.begin(at, p.timeout)
	c.prepare(r, batch)
	return pending{c: c, reused: reused, sent: at}
}

// writeNow writes the pending batch at once.
func (x *pending) writeNow() {
	if x.c != nil && x.err == nil {
		x.err = x.c.src.writeNow()
	}
}

// finish reads the replies to what send gathered, writing it first if
// writeNow did not, and pools the connection. When a reused connection
// turned out broken, a batch of retrievals alone whose replies had not
// begun to arrive is sent again on a new one; any other fails, as in try.
func (p *rawPool) finish(r Retrieval, batch []*Call, x pending) error {
	c, err := x.c, x.err
	if c == nil {
		return p.health.observe(err)
	}
	if err == nil {
		if time.Since(x.sent) > p.timeout/2 {
			// Replies read after another server's took long: the
			// wait for these begins now, so that a slow server
			// elsewhere does not time this one out.
			c.nc.SetDeadline(time.Now().Add(p.timeout))
		}
		if err = c.receive(r, batch); err == nil {
			p.put(c)
			return p.health.observe(nil)
		}
	}
	p.closeOn(c, err)
	if x.reused && !IsTimeout(err) && !IsOutOfStep(err) {
		p.dropIdle()
		if !retrievalsOnly(batch) || c.src.got > 0 {
			return p.health.observe(err)
		}
		err = p.once(func(c *rawConn) error {
			c.prepare(r, batch)
			return c.receive(r, batch)
		})
	}
	return p.health.observe(err)
}

// prepare empties the calls of batch and gathers their requests, to be
// written as the first reply is read (or by writeNow): consecutive gets go
// out as retrieval commands over all their keys, always asking for CAS
// values (gets, or gats); a command goes out as it is.
func (c *rawConn) prepare(r Retrieval, batch []*Call) {
	for _, call := range batch {
		call.Items = append(call.Items[:0], make([]Item, len(call.Keys))...)
		call.Arena = call.Arena[:0]
		call.Reply = call.Reply[:0]
	}
	out, lines := c.out[:0], c.lines[:0]
	for i := 0; i < len(batch); {
		if batch[i].Req != nil {
			out = append(out, batch[i].Req...)
			if batch[i].Data != nil {
				out = append(out, batch[i].Data...)
				out = append(out, crlf...)
			}
			i++
			continue
		}
		j := gets(batch, i)
		var n int
		out, n = appendRetrievals(out, r, batch[i:j])
		lines = append(lines, n)
		i = j
	}
	c.lines = lines
	if len(out) > 0 {
		c.src.out = out // written as the first reply is read
	}
	if cap(out) <= 1<<20 {
		c.out = out
	}
}

// receive reads the replies to the batch prepare gathered, in order: each
// retrieval hit's value straight into its call's arena, a command's reply
// line into its call. memcached answers in request order, which is how
// each reply is matched to its call without a map; so each is checked
// against the request in its place, and a reply that does not fit it is an
// *OutOfStepError, on which the connection is closed. A meta command's
// reply may carry a data block (mg, ma with v): it is read into the call's
// arena.
func (c *rawConn) receive(r Retrieval, batch []*Call) error {
	lines := c.lines
	for i := 0; i < len(batch); {
		if call := batch[i]; call.Req != nil {
			// Every command of Req has the same verb (fills: add).
			family := wire.ReplyOf(call.Req)
			for range max(call.Replies, 1) {
				line, err := readLine(c.rw.Reader)
				if err != nil {
					return err
				}
				if !family.Fits(line) {
					return outOfStepAt(line)
				}
				call.Reply = append(call.Reply, line...)
			}
			// Only a meta command's reply starts "VA ": the
			// classic path pays one comparison.
			if err := readMetaBlock(c.rw.Reader, call); err != nil {
				return err
			}
			i++
			continue
		}
		j := gets(batch, i)
		read := readRetrievals
		if r.Meta {
			read = readMetaRetrievals
		}
		if err := read(c.rw.Reader, lines[0], batch[i:j]); err != nil {
			return err
		}
		lines = lines[1:]
		i = j
	}
	return nil
}

// gets returns the end of the run of gets in batch that starts at i.
func gets(batch []*Call, i int) int {
	for i < len(batch) && batch[i].Req == nil {
		i++
	}
	return i
}

// readRetrievals reads the replies to the retrieval lines written for
// calls (lines of them), up to their last END, into the calls' items.
func readRetrievals(br *bufio.Reader, lines int, calls []*Call) error {
	j, next := 0, 0 // the call, and its next key not yet answered
	for ends := 0; ends < lines; {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if bytes.Equal(line, replyEnd) {
			ends++
			continue
		}
		if !bytes.HasPrefix(line, replyValue) {
			return retrievalError(line)
		}
		key, flags, size, cas, err := parseValueLine(line)
		if err != nil {
			return err
		}
		for j < len(calls) && (next == len(calls[j].Keys) || calls[j].Keys[next] != string(key)) {
			if next++; next >= len(calls[j].Keys) {
				j, next = j+1, 0
			}
		}
		if j == len(calls) {
			return OutOfStep(ReasonUnaskedKey, line)
		}
		call := calls[j]
		off := len(call.Arena)
		call.Arena = slices.Grow(call.Arena, size)[:off+size]
		call.Items[next] = Item{Hit: true, Flags: flags, CAS: cas, Off: off, N: size}
		if err := readValue(br, call.Arena[off:]); err != nil {
			return err
		}
		if next++; next == len(call.Keys) {
			j, next = j+1, 0
		}
	}
	return nil
}

// readMetaRetrievals reads the replies to one mg per key of calls (lines
// of them): "VA <size> <flags>" and the value for a hit, EN for a miss.
func readMetaRetrievals(br *bufio.Reader, lines int, calls []*Call) error {
	for _, call := range calls {
		for i := range call.Keys {
			line, err := readLine(br)
			if err != nil {
				return err
			}
			if bytes.Equal(line, metaMiss) {
				continue
			}
			if !bytes.HasPrefix(line, metaValue) {
				return retrievalError(line)
			}
			size, it, err := ParseMetaValue(line)
			if err != nil {
				return err
			}
			off := len(call.Arena)
			call.Arena = slices.Grow(call.Arena, size)[:off+size]
			call.Items[i] = Item{Hit: true, Flags: it.Flags, CAS: it.CAS, TTL: it.TTL, Off: off, N: size}
			if err := readValue(br, call.Arena[off:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// appendRetrievals appends the request lines for the keys of calls and
// says how many lines it wrote. A gets line may be as long as it needs;
// gats lines are split at lineMax; meta retrievals are one mg per key.
func appendRetrievals(dst []byte, r Retrieval, calls []*Call) ([]byte, int) {
	if r.Meta {
		return appendMetaRetrievals(dst, r, calls)
	}
	lines, start := 0, 0 // start: where the current line begins in dst
	for _, call := range calls {
		for _, k := range call.Keys {
			if lines == 0 || r.Touch && len(dst)-start+1+len(k)+2 > lineMax {
				if lines > 0 {
					dst = append(dst, crlf...)
				}
				start = len(dst)
				if r.Touch {
					dst = append(dst, "gats "...)
					dst = strconv.AppendInt(dst, int64(r.Exptime), 10)
				} else {
					dst = append(dst, "gets"...)
				}
				lines++
			}
			dst = append(dst, ' ')
			dst = append(dst, k...)
		}
	}
	if lines > 0 {
		dst = append(dst, crlf...)
	}
	return dst, lines
}

// appendMetaRetrievals appends "mg <key> v f t c" for every key of calls,
// with the new time to live for a touch.
func appendMetaRetrievals(dst []byte, r Retrieval, calls []*Call) ([]byte, int) {
	lines := 0
	for _, call := range calls {
		for _, k := range call.Keys {
			dst = append(dst, "mg "...)
			dst = append(dst, k...)
			dst = append(dst, " v f t c"...)
			if r.Touch {
				dst = append(dst, " T"...)
				dst = strconv.AppendInt(dst, int64(r.Exptime), 10)
			}
			dst = append(dst, crlf...)
			lines++
		}
	}
	return dst, lines
}

// readMetaBlock reads the data block of a meta command's reply into the
// call's arena, when its line ("VA <size> <flags>*") says one follows.
func readMetaBlock(br *bufio.Reader, call *Call) error {
	rest, ok := bytes.CutPrefix(call.Reply, metaValue)
	if !ok {
		return nil
	}
	word, _, _ := bytes.Cut(rest, []byte{' '})
	word = bytes.TrimSuffix(word, crlf)
	size, ok := wire.ParseDecimal(word, MaxValueLen)
	if !ok {
		return fmt.Errorf("%w: %q", errUnexpectedReply, call.Reply)
	}
	call.Arena = slices.Grow(call.Arena[:0], int(size))[:size]
	return readValue(br, call.Arena)
}

// readValue reads a data block into dst, then its "\r\n".
func readValue(br *bufio.Reader, dst []byte) error {
	if _, err := io.ReadFull(br, dst); err != nil {
		return err
	}
	end, err := br.Peek(2)
	if err != nil {
		return err
	}
	if end[0] != '\r' || end[1] != '\n' {
		return OutOfStep(ReasonMalformed, end)
	}
	br.Discard(2)
	return nil
}

// flushAll sends flush_all, with the delay when one was given. Once
// written it is never sent again: a reply lost before its first byte does
// not show that memcached did not apply it, and flush_all applied at two
// times also removes what other clients stored between the two, after
// they may have seen the first take effect (a delayed one's time moves
// too). A restart still costs it nothing: get finds a connection the
// server closed before anything is written on it.
func (p *rawPool) flushAll(delay int32, withDelay bool) error {
	return p.do(false, func(c *rawConn) error {
		c.rw.WriteString("flush_all")
		if withDelay {
			c.rw.WriteByte(' ')
			c.rw.WriteString(strconv.FormatInt(int64(delay), 10))
		}
		c.rw.Write(crlf)
		return expectLine(c, replyOK)
	})
}

// ping asks the server for its version, the cheapest request it answers
// and one that changes nothing, safe to repeat. An ejected server is not
// asked: it does not answer.
func (p *rawPool) ping() error { return p.do(true, askVersion) }

// probe asks an ejected server for its version, to see if it is back.
func (p *rawPool) probe() error { return p.try(true, askVersion) }

func askVersion(c *rawConn) error {
	c.rw.WriteString("version\r\n")
	return expectLine(c, []byte("VERSION "))
}

// expectLine flushes the request and reads one reply line starting with
// prefix.
func expectLine(c *rawConn, prefix []byte) error {
	if err := c.rw.Flush(); err != nil {
		return err
	}
	line, err := c.rw.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, prefix) {
		return fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return nil
}

// MaxValueLen is the longest value memcached can hold (its -I is at most
// 1 GiB): a reply that announces a longer one is out of step, not a value
// to wait for.
const MaxValueLen = 1 << 30

// parseValueLine reads "VALUE <key> <flags> <bytes>[ <cas>]\r\n".
func parseValueLine(line []byte) (key []byte, flags uint32, size int, cas uint64, err error) {
	key, flags, size, cas, ok := wire.ParseValueLine(line)
	if !ok || size > MaxValueLen {
		return nil, 0, 0, 0, OutOfStep(ReasonMalformed, line)
	}
	return key, flags, size, cas, nil
}

// readLine reads one reply line. No reply line fills the read buffer: one
// that does is not memcached's.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, OutOfStep(ReasonMalformed, line)
	}
	return line, err
}

// outOfStepAt is the error of a reply line that does not fit its request.
func outOfStepAt(line []byte) error {
	if wire.OutOfStep(line) {
		return OutOfStep(ReasonOutOfMemory, line)
	}
	return OutOfStep(ReasonUnexpected, line)
}

// retrievalError is the error of a retrieval answered by line, neither a
// hit nor its end: memcached's own error (the connection is closed, as
// after any error, and the line relayed), or a reply out of step.
func retrievalError(line []byte) error {
	if wire.IsError(line) && !wire.OutOfStep(line) {
		return fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return outOfStepAt(line)
}
