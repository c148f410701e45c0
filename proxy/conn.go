package proxy

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
)

const (
	readBufferSize  = 16 << 10 // memcached's own READ_BUFFER_SIZE
	writeBufferSize = 16 << 10
)

// conn is one client connection. Everything it needs per request is kept
// here and reused, so a steady stream of requests allocates little.
type conn struct {
	p       *Proxy
	nc      net.Conn
	wr      *replyWriter
	words   [][]byte
	noreply bool // suppresses every reply of the current command
	// id numbers the connection for "stats conns"; accepted and lastCmd
	// are when it was accepted and began its last command (Unix ns).
	id       uint64
	accepted int64
	lastCmd  atomic.Int64
	wakeMu   sync.Mutex // guards nc, which a TLS client's enrolment changes

	req     []byte // a command's line, as sent upstream
	scratch []byte

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

	// lc is the connection's state on its event loop.
	lc *loopClient
}

// shrinkKeep bounds the words a connection keeps for the next request.
const shrinkKeep = 4096

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

func newConn(p *Proxy, nc net.Conn) *conn {
	c := &conn{p: p, nc: nc, id: p.connIDs.Add(1), accepted: time.Now().UnixNano()}
	c.words = make([][]byte, 0, wire.MaxTokens)
	return c
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

// logClose logs, at debug level, why a TLS client's handshake or
// enrolment failed. A client that left (EOF) or a shutdown is not an
// error.
func (c *conn) logClose(err error) {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.p.draining():
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

// reply writes b unless the command asked for noreply.
func (c *conn) reply(b []byte) {
	if !c.noreply {
		c.wr.Write(b)
	}
}

// replyNumber writes a decimal number line, as incr and decr answer.
func (c *conn) replyNumber(n uint64) {
	c.scratch = strconv.AppendUint(c.scratch[:0], n, 10)
	c.scratch = append(c.scratch, wire.CRLF...)
	c.reply(c.scratch)
}

// appendValueHeader appends "VALUE <key> <flags> <bytes>[ <cas>]\r\n".
func appendValueHeader(b []byte, key []byte, flags uint32, size int, cas uint64, withCAS bool) []byte {
	b = append(b, wire.LineValue...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(flags), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(size), 10)
	if withCAS {
		b = append(b, ' ')
		b = strconv.AppendUint(b, cas, 10)
	}
	return append(b, wire.CRLF...)
}

// answer relays memcached's reply line to a command, counted by its
// outcome.
func (c *conn) answer(id int, line []byte) stats.Outcome {
	oc := stats.ReplyOutcome(line)
	c.p.stats.Record(id, oc)
	c.reply(line)
	return oc
}
