package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

const (
	readBufferSize  = 16 << 10 // memcached's own READ_BUFFER_SIZE
	writeBufferSize = 16 << 10
	keyMaxLength    = 250 // memcached's KEY_MAX_LENGTH
)

// errQuit closes a connection after its pending replies are written.
var errQuit = errors.New("quit")

// writers holds the reply buffers of connections that wait for a request:
// a connection takes one when a request arrives and puts it back once its
// replies are written, so a thousand idle clients do not hold 16 MiB of
// empty buffers.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufferSize) }}

// conn is one client connection. Everything it needs per request is kept
// here and reused, so a steady stream of requests allocates little beyond
// what gomemcache itself does.
type conn struct {
	p       *Proxy
	nc      net.Conn
	cc      *countingConn
	rd      *reader
	wr      *bufio.Writer
	words   [][]byte
	noreply bool        // suppresses every reply of the current command
	busy    atomic.Bool // handling a request, not waiting for one
	wakeMu  sync.Mutex  // orders wakeIfIdle against markBusy

	up      *upstreams // the server set of the command being handled
	calls   []*getCall // one per server of up
	keys    []string
	owners  []keyOwner
	seen    map[string]keyOwner // keys already grouped in this request
	used    []bool
	item    memcache.Item
	scratch []byte

	// Values of enveloped items: the envelope being written, the value
	// decoded, a value being rebuilt (append, incr…), an item read for
	// that, and a copy of a key that the read buffer may move.
	enc, dec, tmp, raw, keyBuf []byte
	// upBuf holds the rewritten upstream key of the key being handled.
	upBuf []byte
}

// keyOwner locates one requested key's result: which server's call, and
// where in it. srv < 0 marks a key no server can hold; bound marks a
// rewritten key, whose item must be an envelope bound to the client key.
type keyOwner struct {
	srv, pos int32
	bound    bool
	tenant   *tenantCounters // nil: not counted per tenant
}

func newConn(p *Proxy, nc net.Conn) *conn {
	cc := &countingConn{Conn: nc, stats: p.stats, writeTimeout: p.cfg.IdleTimeout}
	c := &conn{p: p, nc: nc, cc: cc}
	c.rd = newReader(cc, readBufferSize, int(p.cfg.MaxRequestLine), c.flush)
	c.words = make([][]byte, 0, maxTokens)
	c.useUpstreams()
	return c
}

// flush writes buffered replies. The reader calls it before any read that
// may block, so replies to a pipelined batch leave in one write.
func (c *conn) flush() error {
	if c.wr == nil || c.wr.Buffered() == 0 {
		return nil
	}
	return c.wr.Flush()
}

// serve runs the connection until the client leaves, breaks framing, or the
// proxy shuts down.
func (c *conn) serve() {
	defer c.nc.Close()
	defer c.putWriter()
	defer c.rd.release()
	c.startIdleClock()
	for {
		line, err := c.rd.line()
		if err == errNeedMore {
			if c.p.draining() {
				c.flush()
				return
			}
			if c.flush() != nil {
				return
			}
			c.putWriter()
			c.rd.park()
			c.busy.Store(false)
			err = c.rd.fill()
			c.markBusy()
			if err != nil {
				if !c.idleClosed(err) {
					c.logClose(err)
				}
				return
			}
			continue
		}
		if err != nil {
			c.flush()
			c.logClose(err)
			return
		}
		if err := c.dispatch(line); err != nil {
			// A data block that did not arrive in time is idleness too.
			if !c.idleClosed(err) {
				c.flush()
				c.logClose(err)
			}
			return
		}
		c.startIdleClock()
		// A client that is gone gets no more work done for it: memcached
		// stops at the first failed write too.
		if c.cc.failed.Load() {
			return
		}
		c.shrink()
	}
}

// logClose logs, once, why a connection is closed on an error: a client
// that broke framing at warn level, a failed read at debug level. A client
// that left (EOF, quit) or a shutdown is not an error.
func (c *conn) logClose(err error) {
	switch {
	case errors.Is(err, errQuit), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.p.draining():
	case errors.Is(err, errLineTooLong):
		c.p.log.Warn("client connection closed", "remote", c.nc.RemoteAddr().String(), "err", err)
	default:
		c.p.log.Debug("client connection closed", "remote", c.nc.RemoteAddr().String(), "err", err)
	}
}

// shrink lets go of per-request buffers that one unusually large request
// grew, so an idle connection holds little memory.
func (c *conn) shrink() {
	const keep = 4096
	if cap(c.words) > keep {
		c.words = make([][]byte, 0, maxTokens)
	}
	if cap(c.keys) > keep {
		c.keys, c.owners, c.seen = nil, nil, nil
		for i, call := range c.calls {
			if cap(call.keys) > keep || cap(call.batchKeys) > keep {
				c.calls[i] = newGetCall()
			}
		}
	}
	for _, b := range []*[]byte{&c.enc, &c.dec, &c.tmp, &c.raw} {
		if cap(*b) > arenaKeep {
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
		c.wr = writers.Get().(*bufio.Writer)
		c.wr.Reset(c.cc)
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
		c.wr.Reset(nil)
		writers.Put(c.wr)
		c.wr = nil
	}
}

// wakeIfIdle ends the blocked read of a connection waiting for a request,
// so that it sees the shutdown.
func (c *conn) wakeIfIdle(now time.Time) {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if !c.busy.Load() {
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

// writeValue writes one VALUE block of a retrieval reply.
func (c *conn) writeValue(key string, flags uint32, cas uint64, value []byte, withCAS bool) {
	b := append(c.scratch[:0], replyValue...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(flags), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(len(value)), 10)
	if withCAS {
		b = append(b, ' ')
		b = strconv.AppendUint(b, cas, 10)
	}
	b = append(b, crlf...)
	c.scratch = b
	c.wr.Write(b)
	c.wr.Write(value)
	c.wr.Write(crlf)
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
func (c *conn) serverFor(key string) int { return c.up.pick(key, c.p.cfg.EjectRehash) }

// countingConn counts the bytes a client sends and receives for stats, and
// remembers whether a write failed. With an idle timeout, a client that
// takes none of its replies for that long is idle too: its write fails.
type countingConn struct {
	net.Conn
	stats        *stats
	writeTimeout time.Duration
	failed       atomic.Bool
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
	n, err := cc.Conn.Write(b)
	cc.stats.bytesWritten.Add(uint64(n))
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			cc.stats.connsIdleClosed.Add(1)
		}
		cc.failed.Store(true)
	}
	return n, err
}
