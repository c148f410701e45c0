package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// rawPool carries the retrievals and the few commands the proxy sends
// without gomemcache, on connections of its own to one server:
//
//   - get, gets, gat and gats over many keys. gomemcache has no multi-key
//     gat and no gats, and its GetMulti renews the socket deadline before
//     every reply line (a server that trickles data is never timed out),
//     starts a goroutine and builds a map per call, and allocates every
//     value. Here one deadline bounds the whole request and values are
//     copied straight into the caller's reused buffer.
//   - flush_all with a delay, and version for readiness.
//
// Storage, delete, touch and arithmetic go through gomemcache.
type rawPool struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout        time.Duration
	connectTimeout time.Duration
	maxIdle        int

	mu     sync.Mutex
	idle   []*rawConn
	closed bool
}

type rawConn struct {
	nc net.Conn
	rw *bufio.ReadWriter
}

var errUnexpectedReply = errors.New("unexpected reply from upstream")

// do runs fn on a pooled connection under one deadline. The connection is
// kept only if fn succeeded.
func (p *rawPool) do(fn func(*rawConn) error) error {
	p.mu.Lock()
	var c *rawConn
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c == nil {
		ctx, cancel := context.WithTimeout(context.Background(), min(p.connectTimeout, p.timeout))
		nc, err := p.dial(ctx, "", "")
		cancel()
		if err != nil {
			return err
		}
		c = &rawConn{nc: nc, rw: bufio.NewReadWriter(bufio.NewReaderSize(nc, 16<<10), bufio.NewWriterSize(nc, 4<<10))}
	}
	c.nc.SetDeadline(time.Now().Add(p.timeout))
	if err := fn(c); err != nil {
		c.nc.Close()
		return err
	}
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
	return nil
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

// retrieval says which retrieval command to send upstream.
type retrieval struct {
	touch   bool  // gat or gats
	exptime int32 // the new expiration time, with touch
}

// found receives one item of a retrieval reply; key and value are only
// valid during the call.
type found func(i int, flags uint32, cas uint64, value []byte)

// retrieve sends keys in one retrieval command, always asking for CAS
// values (gets or gats), and calls hit for each item with the index of
// its key. memcached answers hits in request order, which is how each
// VALUE line is matched to its key without a map.
func (p *rawPool) retrieve(r retrieval, keys []string, hit found) error {
	return p.do(func(c *rawConn) error {
		if r.touch {
			c.rw.WriteString("gats ")
			c.rw.WriteString(strconv.FormatInt(int64(r.exptime), 10))
		} else {
			c.rw.WriteString("gets")
		}
		for _, k := range keys {
			c.rw.WriteByte(' ')
			c.rw.WriteString(k)
		}
		c.rw.Write(crlf)
		if err := c.rw.Flush(); err != nil {
			return err
		}
		next := 0
		for {
			line, err := c.rw.ReadSlice('\n')
			if err != nil {
				return err
			}
			if bytes.Equal(line, replyEnd) {
				return nil
			}
			key, flags, size, cas, err := parseValueLine(line)
			if err != nil {
				return err
			}
			for next < len(keys) && keys[next] != string(key) {
				next++
			}
			if next == len(keys) {
				return fmt.Errorf("%w: %q answers no key asked for", errUnexpectedReply, line)
			}
			if err := readValue(c.rw.Reader, size, func(v []byte) { hit(next, flags, cas, v) }); err != nil {
				return err
			}
			next++
		}
	})
}

// readValue reads a size-byte data block and its "\r\n", handing the block
// to use without a copy when it fits the reader's buffer.
func readValue(br *bufio.Reader, size int, use func([]byte)) error {
	if size+2 <= br.Size() {
		b, err := br.Peek(size + 2)
		if err != nil {
			return err
		}
		if !bytes.HasSuffix(b, crlf) {
			return errUnexpectedReply
		}
		use(b[:size])
		_, err = br.Discard(size + 2)
		return err
	}
	b := make([]byte, size+2)
	if _, err := io.ReadFull(br, b); err != nil {
		return err
	}
	if !bytes.HasSuffix(b, crlf) {
		return errUnexpectedReply
	}
	use(b[:size])
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
func (p *rawPool) ping() error {
	return p.do(func(c *rawConn) error {
		c.rw.WriteString("version\r\n")
		return expectLine(c, []byte("VERSION "))
	})
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

// parseValueLine reads "VALUE <key> <flags> <bytes> [<cas>]\r\n".
func parseValueLine(line []byte) (key []byte, flags uint32, size int, cas uint64, err error) {
	rest, ok := bytes.CutPrefix(line, replyValue)
	if !ok || !bytes.HasSuffix(rest, crlf) {
		return nil, 0, 0, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	var words [5][]byte
	w, overflow := tokenize(words[:0], rest[:len(rest)-2], 4)
	if overflow || len(w) < 3 {
		return nil, 0, 0, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	flags, ok1 := parseUint32(w[1])
	n, ok2 := parseUint64(w[2])
	ok3 := true
	if len(w) == 4 {
		cas, ok3 = parseUint64(w[3])
	}
	if !ok1 || !ok2 || !ok3 || n > 1<<30 {
		return nil, 0, 0, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return w[0], flags, int(n), cas, nil
}
