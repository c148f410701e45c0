package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/sockio"
	"mcsidecar/proxy/tier"
	"mcsidecar/proxy/upstream"
)

const (
	readBufferSize  = 16 << 10 // memcached's own READ_BUFFER_SIZE
	writeBufferSize = 16 << 10
	keyMaxLength    = 250 // memcached's KEY_MAX_LENGTH
)

// errQuit closes a connection after its pending replies are written.
var errQuit = errors.New("quit")

// conn is one client connection. Everything it needs per request is kept
// here and reused, so a steady stream of requests allocates little.
type conn struct {
	p       *Proxy
	nc      net.Conn
	cc      *countingConn
	rd      *reader
	wr      *replyWriter
	words   [][]byte
	noreply bool      // suppresses every reply of the current command
	idleBy  time.Time // when the idle clock runs out; zero: never
	// lineStart is where the line being handled begins in the read
	// buffer, for putting it back while its data block arrives.
	lineStart int
	busy      atomic.Bool // handling a request, not waiting for one
	// inBlock: waiting for the rest of a data block whose command line
	// came. A shutdown lets it come (the request is in flight); the
	// grace period bounds the wait.
	inBlock atomic.Bool
	// id numbers the connection for "stats conns"; accepted and lastCmd
	// are when it was accepted and began its last command (Unix ns).
	id       uint64
	accepted int64
	lastCmd  atomic.Int64
	wakeMu   sync.Mutex // orders wakeIfIdle against markBusy

	up    *upstream.Set    // the local zone's set for the command being handled
	calls []*upstream.Call // one per server of up
	cmd   *upstream.Call   // a command's call, on whichever server
	// zs is every zone's set and calls, the local zone's first (the same
	// as up and calls); nil without zones.
	zs []zoneCalls
	// tierMode is how the retrieval being handled uses the local tier,
	// and now the time it started, for the tier's expiry.
	tierMode uint8
	now      int64
	// changed reports that the last read-modify-write stored its value;
	// with quietMiss set, one that finds no item answers nothing and sets
	// missed, so that the next zone can be asked.
	changed, quietMiss, missed bool
	fillBuf                    []byte     // the fills of a read, before they are grouped
	fillNotes                  []fillNote // the fills of a read, in fillBuf's order
	alignReq                   []byte     // the set or delete that brings other zones in line
	req                        []byte     // a command's line, as sent upstream
	keys                       []string
	owners                     []keyOwner
	seen                       map[string]keyOwner // keys already grouped in this request
	used, led                  []bool
	scratch                    []byte

	// Values of enveloped items: the envelope being written, the value
	// decoded, a value being rebuilt (append, incr…), an item read for
	// that, and a copy of a key that the read buffer may move.
	enc, dec, tmp, raw, keyBuf []byte
	// upBuf holds the rewritten upstream key of the key being handled.
	upBuf []byte
	// match is where the key being handled matched the key schemes.
	match keyspace.Match

	// mst is the state of meta commands, made by the first one: most
	// connections never send one, and an idle connection stays small.
	mst *metaState
	// ahead holds mg fetched ahead of their turn (see readAhead), and
	// aheadWindow is how many the next batch may hold (0: none yet).
	ahead       *metaAhead
	aheadWindow int

	// lc is the connection's state on an event loop (--event-loop); the
	// goroutine path takes the connection over with adopt.
	lc *loopClient
}

// metaState is what a connection keeps for the meta command being
// handled: its line's words, copied out of the read buffer, the request
// parsed from them, memcached's reply line (a copy) split into flags, and
// the reply being built.
type metaState struct {
	req   metaReq
	line  []byte
	words [][]byte
	rep   metaReply
	up    []byte
	out   []byte
}

// keyOwner locates one requested key's result: which server's call, and
// where in it. srv < 0 marks a key no server can hold; bound marks a
// rewritten key, whose item must be an envelope bound to the client key.
type keyOwner struct {
	srv, pos int32
	zone     int32 // the zone of srv: 0, the local one, unless zones answered
	bound    bool
	// immutable: the client key's value never changes, so the local
	// tier may keep it.
	immutable bool
	tenant    *tenantCounters // nil: not counted per tenant
	entry     *tier.Entry     // the local tier's answer; srv is then -1
	written   uint64          // the count of its key's write stripe, noted before it was asked (see writeGuard)
	// refused: the item was a hit upstream that the client gets as a miss
	// (an envelope refused, a plain item under a rewritten key).
	refused bool
	// repeat: the key was named earlier in the retrieval, whose answer
	// this one shares.
	repeat bool
}

func newConn(p *Proxy, nc net.Conn) *conn {
	c := &conn{p: p, id: p.connIDs.Add(1), accepted: time.Now().UnixNano()}
	c.attach(nc)
	c.words = make([][]byte, 0, maxTokens)
	c.cmd = upstream.NewCall()
	c.useUpstreams()
	return c
}

// attach makes nc the connection's socket, with a new reader.
func (c *conn) attach(nc net.Conn) {
	cc := &countingConn{Conn: nc, stats: c.p.stats, writeTimeout: c.p.cfg.IdleTimeout}
	if rc := sockio.RawConnOf(nc); rc != nil {
		cc.direct, cc.raw = true, sockio.NewWriter(rc)
	}
	c.nc, c.cc = nc, cc
	c.rd = newReader(cc, readBufferSize, int(c.p.cfg.MaxRequestLine), c.p.keyLine, c.flush)
}

// sock returns the connection's socket, which a TLS client's enrolment
// on a loop changes (see enrollTLS).
func (c *conn) sock() net.Conn {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	return c.nc
}

// closeNow closes the connection's socket, whichever it is now.
func (c *conn) closeNow() {
	c.wakeMu.Lock()
	c.nc.Close()
	c.wakeMu.Unlock()
}

// flush writes buffered replies. The reader calls it before any read that
// may block, so replies to a pipelined batch leave in one write.
func (c *conn) flush() error {
	if c.wr == nil {
		return nil
	}
	return c.wr.flush()
}

// serve runs the connection until the client leaves, breaks framing, or the
// proxy shuts down.
func (c *conn) serve() {
	defer c.nc.Close()
	defer c.putWriter()
	defer c.rd.release()
	c.startIdleClock()
	if testStall > 0 {
		time.Sleep(testStall)
	}
	var err error
	if rc := sockio.RawConnOf(c.nc); rc != nil {
		err = c.serveReady(rc)
	} else {
		err = c.serveBlocking()
	}
	if err == nil || c.idleClosed(err) {
		return
	}
	c.flush()
	c.logClose(err)
}

// serveReady runs the connection inside one wait for readability of its
// socket, as an event loop would: each time the poller reports the socket
// readable, the connection reads once, handles every request that arrived,
// writes the replies, and waits again. A read that finds the socket empty
// costs a system call and returns nothing: a connection that reads until
// it sees EAGAIN makes one such read per request. Here a read that did not
// fill the buffer ends the turn, and the next read happens only when the
// poller says bytes are there.
func (c *conn) serveReady(rc syscall.RawConn) error {
	c.rd.flush = nil // replies are written before each wait, below
	c.rd.ready = true
	src := &fdReader{stats: c.p.stats}
	c.rd.src = src
	var result error
	done, lingering := false, false
	turn := func(fd uintptr) bool {
		src.fd = int(fd)
		c.markBusy()
		lingered := lingering // the deadline may be linger's
		lingering = false
		for {
			err := c.rd.fill()
			if err == errWouldBlock {
				break
			}
			if err == nil {
				err = c.process()
			}
			if err != errNeedMore {
				result, done = err, true
				return true
			}
			if c.rd.short {
				// A read that did not fill the buffer found the socket
				// empty, but for an end of stream that came with the
				// last bytes: linger covers that.
				lingering = true
				break
			}
		}
		if c.p.draining() && c.rd.want == 0 {
			c.flush()
			done = true
			return true
		}
		if result = c.flush(); result != nil {
			done = true
			return true
		}
		c.park()
		switch {
		case lingering:
			c.nc.SetReadDeadline(c.lingerUntil())
		case lingered:
			c.nc.SetReadDeadline(c.idleBy)
		}
		c.waiting()
		return false
	}
	for {
		err := rc.Read(turn)
		if done {
			return result
		}
		if c.p.draining() && !(lingering && c.rd.want > 0 && errors.Is(err, os.ErrDeadlineExceeded)) {
			return nil // but a data block arriving reads on: its request is in flight
		}
		if lingering && errors.Is(err, os.ErrDeadlineExceeded) && (c.idleBy.IsZero() || time.Now().Before(c.idleBy)) {
			// Nothing came for a while: read once, for the end of
			// stream a half-closing client sent with its last request.
			// A wait begins with the deadline checked, so it goes first.
			lingering = false
			c.nc.SetReadDeadline(c.idleBy)
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && !c.idleBy.IsZero() && !time.Now().Before(c.idleBy) {
			// The idle clock ran out. A wait checks the deadline before
			// it reads, so bytes that came in time while this goroutine
			// was slow to get to them (a busy machine) are still unread:
			// handle what is there once. A whole request starts the
			// clock again; bytes that make none leave it run out.
			clock := c.idleBy
			if cerr := rc.Control(func(fd uintptr) { turn(fd) }); cerr != nil {
				return err
			}
			if done {
				return result
			}
			if !c.idleBy.Equal(clock) {
				continue
			}
		}
		return err // the idle clock ran out, or the connection was closed
	}
}

// testStall, when a test sets it, is how long a connection's goroutine
// sleeps once its idle clock has started, as on a machine too busy to run
// it.
var testStall time.Duration

// linger is how long a connection waits for more bytes after a read that
// emptied its socket before it reads once more anyway. An end of stream
// that arrives with the last request raises no further readiness, so a
// client that half-closes after its last request would otherwise wait for
// its connection to close forever. Under load the next request comes
// first and the extra read never happens.
const linger = 20 * time.Millisecond

// lingerUntil is when to read once more: after linger, or when the idle
// clock runs out if that is sooner.
func (c *conn) lingerUntil() time.Time {
	t := time.Now().Add(linger)
	if !c.idleBy.IsZero() && c.idleBy.Before(t) {
		return c.idleBy
	}
	return t
}

// serveBlocking runs a connection whose socket the proxy cannot wait on
// itself (TLS): it reads, handles what arrived, and reads again.
func (c *conn) serveBlocking() error {
	c.markBusy()
	// spared: the run of the idle clock spareLate spared, if any.
	var spared time.Time
	for {
		err := c.process()
		if err != errNeedMore {
			return err
		}
		if c.p.draining() && c.rd.want == 0 {
			c.flush()
			return nil
		}
		if err := c.flush(); err != nil {
			return err
		}
		c.park()
		c.waiting()
		c.spareLate(&spared)
		err = c.rd.fill()
		c.markBusy()
		if err != nil {
			return err
		}
	}
}

// spareLate gives a connection whose idle clock ran out before its
// goroutine got to read (a busy machine), with bytes waiting in its
// socket, one more --idle-timeout to make a request of them: a read
// checks its deadline before it reads, so what came in time would never
// be read. It is the TLS path's second look (serveReady handles what is
// waiting instead, which a TLS session's records do not let it). Once a
// run of the clock: a trickle that makes no request is still closed.
func (c *conn) spareLate(spared *time.Time) {
	if c.idleBy.IsZero() || c.idleBy.Equal(*spared) || time.Now().Before(c.idleBy) || !sockio.Waiting(c.nc) {
		return
	}
	*spared = c.idleBy
	// Under wakeMu, as a shutdown's wake-up (wakeIfIdle): this deadline
	// must not undo one.
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if !c.p.draining() {
		c.nc.SetReadDeadline(time.Now().Add(c.p.cfg.IdleTimeout))
	}
}

// park lets go of the buffers a connection that is about to wait for its
// client needs only while it works: an idle connection keeps none.
func (c *conn) park() {
	c.putWriter()
	c.rd.park()
	c.ahead = nil
}

// process handles every request that has arrived whole. It returns
// errNeedMore once it needs more bytes, and otherwise the error that
// closes the connection.
func (c *conn) process() error {
	for {
		start := c.rd.r
		line, err := c.rd.line()
		if err != nil {
			// What was read ahead is for the lines read so far only.
			// Its buffers stay for the next read, until the connection
			// waits (see park).
			c.ahead.drop()
			return err
		}
		if err := c.dispatch(line, start); err != nil {
			return err
		}
		c.startIdleClock()
		// A client that is gone gets no more work done for it: memcached
		// stops at the first failed write too.
		if c.cc.failed.Load() {
			return errClientGone
		}
		c.shrink()
	}
}

// errClientGone ends a connection whose replies can no longer be written.
var errClientGone = errors.New("client gone")

// fdReader reads a non-blocking socket once, without waiting: an empty
// socket is errWouldBlock.
type fdReader struct {
	fd    int
	stats *stats
}

func (r *fdReader) Read(b []byte) (int, error) {
	n, again, err := sockio.Read(r.fd, b)
	if again {
		return 0, errWouldBlock
	}
	r.stats.bytesRead.Add(uint64(n))
	return n, err
}

// logClose logs, once, why a connection is closed on an error: a client
// that broke framing at warn level, a failed read at debug level. A client
// that left (EOF, quit) or a shutdown is not an error.
func (c *conn) logClose(err error) {
	switch {
	case errors.Is(err, errQuit), errors.Is(err, errClientGone), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.p.draining():
	case errors.Is(err, errLineTooLong):
		c.p.log.Warn("client connection closed", "remote", remoteOf(c.nc), "err", err)
	default:
		c.p.log.Debug("client connection closed", "remote", remoteOf(c.nc), "err", err)
	}
}

// remoteOf names the client at the other end of nc (a net.Conn or an
// evloop.Conn), if it still knows it.
func remoteOf(nc interface{ RemoteAddr() net.Addr }) string {
	if a := nc.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// shrinkKeep bounds the entries of a per-request slice (words, keys, a
// call's keys and batches) that a connection keeps for the next request.
const shrinkKeep = 4096

// shrink lets go of per-request buffers that one unusually large request
// grew, so an idle connection holds little memory.
func (c *conn) shrink() {
	const keep = shrinkKeep
	if cap(c.words) > keep {
		c.words = make([][]byte, 0, maxTokens)
	}
	if cap(c.keys) > keep {
		c.keys, c.owners, c.seen = nil, nil, nil
		for i, call := range c.calls {
			if call.Grown(keep) {
				c.calls[i] = upstream.NewCall()
			}
		}
	}
	if c.mst != nil && (cap(c.mst.line) > keep || cap(c.mst.req.keyBuf) > keep || cap(c.mst.up) > keep || cap(c.mst.out) > keep) {
		c.mst = nil
	}
	for _, b := range []*[]byte{&c.enc, &c.dec, &c.tmp, &c.raw} {
		if cap(*b) > upstream.ArenaKeep {
			*b = nil
		}
	}
	c.rd.shrink()
}

// markBusy records that the connection is handling a request and gives it
// a reply buffer. During a
// shutdown it also lifts a read deadline that wakeIfIdle may have set just
// as the request arrived, so the request can still read its data block.
func (c *conn) markBusy() {
	if c.wr == nil {
		c.wr = replyWriters.Get().(*replyWriter)
		c.wr.reset(c.cc)
	}
	c.busy.Store(true)
	if c.p.draining() {
		c.wakeMu.Lock()
		c.nc.SetReadDeadline(time.Time{})
		c.wakeMu.Unlock()
	}
}

// putWriter returns the reply buffer, empty, to the pool.
func (c *conn) putWriter() {
	if c.wr != nil {
		c.wr.reset(nil)
		replyWriters.Put(c.wr)
		c.wr = nil
	}
}

// waiting marks the connection as waiting for its client, for a request or
// for the rest of a data block (inBlock). inBlock is stored first, so that
// wakeIfIdle, seeing the connection not busy, sees which.
func (c *conn) waiting() {
	c.inBlock.Store(c.rd.want > 0)
	c.busy.Store(false)
}

// wakeIfIdle ends the blocked read of a connection waiting for a request,
// so that it sees the shutdown. One waiting for the rest of a data block
// reads on (see waiting).
func (c *conn) wakeIfIdle(now time.Time) {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if !c.busy.Load() && !c.inBlock.Load() {
		c.nc.SetReadDeadline(now)
	}
}

// reply writes b unless the command asked for noreply.
func (c *conn) reply(b []byte) {
	if !c.noreply {
		c.wr.Write(b)
	}
}

// replyNumber writes a decimal number line, as incr and decr answer.
func (c *conn) replyNumber(n uint64) {
	c.scratch = strconv.AppendUint(c.scratch[:0], n, 10)
	c.scratch = append(c.scratch, crlf...)
	c.reply(c.scratch)
}

// writeValue writes one VALUE block of a retrieval reply. A value that
// stays unchanged until the replies are flushed (a value read from
// upstream, in its call's arena) is marked stable and is not copied.
func (c *conn) writeValue(key string, flags uint32, cas uint64, value []byte, withCAS, stable bool) {
	b := appendValueHeader(c.scratch[:0], key, flags, len(value), cas, withCAS)
	c.scratch = b
	c.wr.Write(b)
	if stable {
		c.wr.writeRef(value)
	} else {
		c.wr.Write(value)
	}
	c.wr.Write(crlf)
}

// appendValueHeader appends "VALUE <key> <flags> <bytes>[ <cas>]\r\n".
func appendValueHeader(b []byte, key string, flags uint32, size int, cas uint64, withCAS bool) []byte {
	b = append(b, replyValue...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(flags), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(size), 10)
	if withCAS {
		b = append(b, ' ')
		b = strconv.AppendUint(b, cas, 10)
	}
	return append(b, crlf...)
}

// send runs one command on srv, pipelined with other clients' requests,
// and returns the line memcached answered it with. data is the command's
// data block, or nil.
func (c *conn) send(srv *upstream.Server, req, data []byte) ([]byte, error) {
	return sendOn(c.cmd, srv, req, data)
}

// answer relays memcached's reply line to a command, counted by its
// outcome.
func (c *conn) answer(id int, line []byte) outcome {
	oc := replyOutcome(line)
	c.p.stats.record(id, oc)
	c.reply(line)
	return oc
}

// forwardable reports whether the upstream client can carry key as it is:
// gomemcache refuses control bytes, spaces and DEL.
func forwardable(key []byte) bool {
	for _, b := range key {
		if b <= ' ' || b == 0x7f {
			return false
		}
	}
	return true
}

// serverFor returns the index of the server that owns key.
func (c *conn) serverFor(key string) int { return c.up.Pick(key, c.p.cfg.EjectRehash) }

// countingConn counts the bytes a client sends and receives for stats, and
// remembers whether a write failed. With an idle timeout, a client that
// takes none of its replies for that long is idle too: its write fails.
type countingConn struct {
	net.Conn
	stats        *stats
	writeTimeout time.Duration
	direct       bool           // a plain socket: writev writes many pieces at once
	raw          *sockio.Writer // its writes, with direct
	failed       atomic.Bool
	// idleCounted: the connection is counted as closed for idling, once,
	// whether its write or its read timed out first (see countIdle);
	// unreadCounted, as closed with replies left unread (countUnread).
	idleCounted, unreadCounted atomic.Bool
}

// countIdle counts the connection in idle_kicks unless it was already:
// a client that takes no replies may see its write and its read time out
// at once, on two goroutines.
func (cc *countingConn) countIdle() {
	if cc.idleCounted.CompareAndSwap(false, true) {
		cc.stats.connsIdleClosed.Add(1)
	}
}

// countUnread counts the connection as closed with replies it left
// unread, once, and as idle: a write did not finish in --idle-timeout.
func (cc *countingConn) countUnread() {
	cc.countIdle()
	if cc.unreadCounted.CompareAndSwap(false, true) {
		cc.stats.connsOutputClosed.Add(1)
	}
}

func (cc *countingConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	cc.stats.bytesRead.Add(uint64(n))
	return n, err
}

func (cc *countingConn) Write(b []byte) (int, error) {
	if cc.writeTimeout > 0 {
		cc.Conn.SetWriteDeadline(time.Now().Add(cc.writeTimeout))
	}
	if cc.raw != nil {
		n, err := cc.raw.WriteOne(b)
		return int(n), cc.wrote(n, err)
	}
	n, err := cc.Conn.Write(b)
	return n, cc.wrote(int64(n), err)
}

// writeBuffers writes every piece of bufs, with writev where the
// connection takes it.
func (cc *countingConn) writeBuffers(bufs *net.Buffers) error {
	if cc.writeTimeout > 0 {
		cc.Conn.SetWriteDeadline(time.Now().Add(cc.writeTimeout))
	}
	if cc.raw != nil {
		n, err := cc.raw.Write(*bufs)
		return cc.wrote(n, err)
	}
	n, err := bufs.WriteTo(cc.Conn)
	return cc.wrote(n, err)
}

// wrote counts n bytes written and remembers a failed write.
func (cc *countingConn) wrote(n int64, err error) error {
	cc.stats.bytesWritten.Add(uint64(n))
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			cc.countUnread()
		}
		cc.failed.Store(true)
	}
	return err
}
