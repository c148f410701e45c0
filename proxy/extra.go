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

	"github.com/bradfitz/gomemcache/memcache"
)

// extraPool carries the commands gomemcache has no call for: gat and gats
// over many keys with their CAS values, and flush_all with a delay. It is
// the smallest addition that keeps those replies exact; everything else goes
// through gomemcache.
type extraPool struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout        time.Duration
	connectTimeout time.Duration
	maxIdle        int

	mu   sync.Mutex
	idle []*extraConn
}

type extraConn struct {
	nc net.Conn
	rw *bufio.ReadWriter
}

var errUnexpectedReply = errors.New("unexpected reply from upstream")

// do runs fn on a pooled connection, which is kept only if fn succeeds or
// failed with a cache outcome.
func (p *extraPool) do(fn func(*extraConn) error) error {
	p.mu.Lock()
	var c *extraConn
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c == nil {
		ctx, cancel := context.WithTimeout(context.Background(), p.connectTimeout)
		nc, err := p.dial(ctx, "", "")
		cancel()
		if err != nil {
			return err
		}
		c = &extraConn{nc: nc, rw: bufio.NewReadWriter(bufio.NewReader(nc), bufio.NewWriter(nc))}
	}
	c.nc.SetDeadline(time.Now().Add(p.timeout))
	err := fn(c)
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		c.nc.Close()
		return err
	}
	p.mu.Lock()
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
	return err
}

func (p *extraPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		c.nc.Close()
	}
	p.idle = nil
}

// getAndTouch sends "gat" (or "gats" with withCAS) for keys and calls found
// for each item returned.
func (p *extraPool) getAndTouch(exptime int32, keys []string, withCAS bool, found func(*memcache.Item)) error {
	return p.do(func(c *extraConn) error {
		verb := "gat "
		if withCAS {
			verb = "gats "
		}
		c.rw.WriteString(verb)
		c.rw.WriteString(strconv.FormatInt(int64(exptime), 10))
		for _, k := range keys {
			c.rw.WriteByte(' ')
			c.rw.WriteString(k)
		}
		c.rw.Write(crlf)
		if err := c.rw.Flush(); err != nil {
			return err
		}
		for {
			line, err := c.rw.ReadSlice('\n')
			if err != nil {
				return err
			}
			if bytes.Equal(line, replyEnd) {
				return nil
			}
			it, size, err := parseValueLine(line)
			if err != nil {
				return err
			}
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(c.rw, buf); err != nil {
				return err
			}
			if !bytes.HasSuffix(buf, crlf) {
				return errUnexpectedReply
			}
			it.Value = buf[:size]
			found(it)
		}
	})
}

// flushAll sends flush_all, with the delay when one was given.
func (p *extraPool) flushAll(delay int32, withDelay bool) error {
	return p.do(func(c *extraConn) error {
		c.rw.WriteString("flush_all")
		if withDelay {
			c.rw.WriteByte(' ')
			c.rw.WriteString(strconv.FormatInt(int64(delay), 10))
		}
		c.rw.Write(crlf)
		if err := c.rw.Flush(); err != nil {
			return err
		}
		line, err := c.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		if !bytes.Equal(line, replyOK) {
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		return nil
	})
}

// parseValueLine reads "VALUE <key> <flags> <bytes> [<cas>]\r\n".
func parseValueLine(line []byte) (*memcache.Item, int, error) {
	rest, ok := bytes.CutPrefix(line, replyValue)
	if !ok || !bytes.HasSuffix(rest, crlf) {
		return nil, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	var words [4][]byte
	w, overflow := tokenize(words[:0], rest[:len(rest)-2], 4)
	if overflow || len(w) < 3 {
		return nil, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	flags, ok1 := parseUint32(w[1])
	size, ok2 := parseUint64(w[2])
	if !ok1 || !ok2 || size > 1<<31 {
		return nil, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	it := &memcache.Item{Key: string(w[0]), Flags: flags}
	if len(w) == 4 {
		cas, ok := parseUint64(w[3])
		if !ok {
			return nil, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		it.CasID = cas
	}
	return it, int(size), nil
}

// ping asks the server for its version, the cheapest request it answers.
func (p *extraPool) ping() error {
	return p.do(func(c *extraConn) error {
		c.rw.WriteString("version\r\n")
		if err := c.rw.Flush(); err != nil {
			return err
		}
		line, err := c.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(line, []byte("VERSION ")) {
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		return nil
	})
}
