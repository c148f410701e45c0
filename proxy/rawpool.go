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
//   - flush_all (gomemcache's takes no delay), and version for readiness.
//
// Storage, delete, touch and arithmetic go through gomemcache.
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

type rawConn struct {
	nc net.Conn
	rw *bufio.ReadWriter
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
	if err != nil && reused && !isTimeout(err) {
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
	return &rawConn{nc: nc, rw: bufio.NewReadWriter(bufio.NewReaderSize(nc, 16<<10), bufio.NewWriterSize(nc, 4<<10))}, false, nil
}

// run runs fn on c under one deadline and pools c again if fn succeeded.
func (p *rawPool) run(c *rawConn, fn func(*rawConn) error) error {
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

// retrieval says which retrieval command to send upstream.
type retrieval struct {
	touch   bool  // gat or gats
	exptime int32 // the new expiration time, with touch
}

// lineMax is the longest non-get line memcached reads in pieces: with more
// than this buffered and no newline it hangs up, so a long gats is split
// into several pipelined lines no longer than this.
const lineMax = 2048

// retrieve sends keys in retrieval commands, always asking for CAS values
// (gets, or gats), and reads each hit's value into the buffer that hit
// returns for it: i is the key's index in keys. begin runs before every
// attempt, since a retry starts over. memcached answers hits in request
// order, which is how each VALUE line is matched to its key without a map.
func (p *rawPool) retrieve(r retrieval, keys []string, begin func(), hit func(i int, flags uint32, cas uint64, size int) []byte) error {
	return p.do(func(c *rawConn) error {
		begin()
		lines := writeRetrievals(c.rw.Writer, r, keys)
		if err := c.rw.Flush(); err != nil {
			return err
		}
		next := 0
		for ends := 0; ends < lines; {
			line, err := c.rw.ReadSlice('\n')
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
			for next < len(keys) && keys[next] != string(key) {
				next++
			}
			if next == len(keys) {
				return fmt.Errorf("%w: %q answers no key asked for", errUnexpectedReply, line)
			}
			if err := readValue(c.rw.Reader, hit(next, flags, cas, size)); err != nil {
				return err
			}
			next++
		}
		return nil
	})
}

// writeRetrievals writes the request lines for keys and returns how many
// it wrote. A gets line may be as long as it needs; gats lines are split
// at lineMax.
func writeRetrievals(w *bufio.Writer, r retrieval, keys []string) int {
	var verb []byte
	if r.touch {
		verb = strconv.AppendInt([]byte("gats "), int64(r.exptime), 10)
	} else {
		verb = []byte("gets")
	}
	lines, n := 0, 0
	for i, k := range keys {
		if i == 0 || r.touch && n+1+len(k)+2 > lineMax {
			if i > 0 {
				w.Write(crlf)
			}
			w.Write(verb)
			n = len(verb)
			lines++
		}
		w.WriteByte(' ')
		w.WriteString(k)
		n += 1 + len(k)
	}
	w.Write(crlf)
	return lines
}

// readValue reads a data block into dst, then its "\r\n".
func readValue(br *bufio.Reader, dst []byte) error {
	if _, err := io.ReadFull(br, dst); err != nil {
		return err
	}
	var end [2]byte
	if _, err := io.ReadFull(br, end[:]); err != nil {
		return err
	}
	if end != [2]byte{'\r', '\n'} {
		return errUnexpectedReply
	}
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
