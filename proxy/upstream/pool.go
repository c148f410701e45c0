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
}

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
		return s.nc.Read(p)
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
func (p *rawPool) do(fn func(*rawConn) error) error {
	return p.guard(func() error { return p.try(fn) })
}

// guard sends a request unless the server is ejected, and counts the
// result towards ejecting it.
func (p *rawPool) guard(send func() error) error {
	if err := p.health.admit(); err != nil {
		return err
	}
	return p.health.observe(send())
}

// once runs fn on a pooled connection under one deadline, and never a
// second time: for a request that must not be repeated.
func (p *rawPool) once(fn func(*rawConn) error) error {
	c, _, err := p.get()
	if err != nil {
		return err
	}
	return p.run(c, fn)
}

// try runs fn on a pooled connection under one deadline. The connection is
// kept only if fn succeeded. When a connection taken from the idle pool
// fails other than by timing out, the server has most likely restarted:
// every idle connection is dropped and fn runs once more on a new one, so
// a restart costs no client a failed request. fn must be safe to repeat.
func (p *rawPool) try(fn func(*rawConn) error) error {
	c, reused, err := p.get()
	if err != nil {
		return err
	}
	err = p.run(c, fn)
	if err != nil && reused && !IsTimeout(err) {
		p.dropIdle()
		if c, _, err = p.get(); err != nil {
			return err
		}
		err = p.run(c, fn)
	}
	return err
}

// get returns an idle connection, or a new one.
func (p *rawPool) get() (c *rawConn, reused bool, err error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c != nil {
		return c, true, nil
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
	c.nc.SetDeadline(time.Now().Add(p.timeout))
	if err := fn(c); err != nil {
		c.nc.Close()
		return err
	}
	p.put(c)
	return nil
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
// the replies in the same order (prepare, receive). A retry starts over:
// the calls are emptied first.
func (p *rawPool) exchange(r Retrieval, batch []*Call) error {
	return p.do(func(c *rawConn) error {
		c.prepare(r, batch)
		return c.receive(r, batch)
	})
}

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
// the retry on a broken pooled connection are as in exchange.
func (p *rawPool) send(r Retrieval, batch []*Call) pending {
	if err := p.health.admit(); err != nil {
		return pending{err: err}
	}
	c, reused, err := p.get()
	if err != nil {
		return pending{err: err}
	}
	at := time.Now()
	c.nc.SetDeadline(at.Add(p.timeout))
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
// writeNow did not, and pools the connection. A reused connection that
// turned out broken is replaced and the batch sent again, as try does.
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
	c.nc.Close()
	if x.reused && !IsTimeout(err) {
		p.dropIdle()
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
// each reply is matched to its call without a map. A meta command's reply
// may carry a data block (mg, ma with v): it is read into the call's
// arena.
func (c *rawConn) receive(r Retrieval, batch []*Call) error {
	lines := c.lines
	for i := 0; i < len(batch); {
		if call := batch[i]; call.Req != nil {
			for range max(call.Replies, 1) {
				line, err := c.rw.ReadSlice('\n')
				if err != nil {
					return err
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
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if bytes.Equal(line, replyEnd) {
			ends++
			continue
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
			return fmt.Errorf("%w: %q answers no key asked for", errUnexpectedReply, line)
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
			line, err := br.ReadSlice('\n')
			if err != nil {
				return err
			}
			if bytes.Equal(line, metaMiss) {
				continue
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
		return errUnexpectedReply
	}
	br.Discard(2)
	return nil
}

// flushAll sends flush_all, with the delay when one was given.
func (p *rawPool) flushAll(delay int32, withDelay bool) error {
	return p.do(func(c *rawConn) error {
		c.rw.WriteString("flush_all")
		if withDelay {
			c.rw.WriteByte(' ')
			c.rw.WriteString(strconv.FormatInt(int64(delay), 10))
		}
		c.rw.Write(crlf)
		return expectLine(c, replyOK)
	})
}

// ping asks the server for its version, the cheapest request it answers.
// An ejected server is not asked: it does not answer.
func (p *rawPool) ping() error { return p.do(askVersion) }

// probe asks an ejected server for its version, to see if it is back.
func (p *rawPool) probe() error { return p.try(askVersion) }

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
		return nil, 0, 0, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return key, flags, size, cas, nil
}
