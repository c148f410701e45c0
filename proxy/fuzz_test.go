package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxFuzzInput bounds one fuzz input, so that a run explores many small
// requests rather than a few large ones.
const maxFuzzInput = 64 << 10

// chunkedReader is a client that delivers its bytes in the chunk sizes the
// fuzzer picks, as a socket delivers a stream in arbitrary reads.
type chunkedReader struct {
	data       []byte
	sizes      []byte // each read returns 1+sizes[i] bytes at most, cycling
	eofAtLast  bool   // return io.EOF together with the last bytes
	off        int
	reads      int
	emptyReads int // reads offered no room: the reader broke its contract
}

func (cr *chunkedReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		cr.emptyReads++
		return 0, nil
	}
	if cr.off == len(cr.data) {
		return 0, io.EOF
	}
	n := 1
	if len(cr.sizes) > 0 {
		n += int(cr.sizes[cr.reads%len(cr.sizes)])
	}
	cr.reads++
	n = min(n, len(p), len(cr.data)-cr.off)
	copy(p, cr.data[cr.off:cr.off+n])
	cr.off += n
	if cr.eofAtLast && cr.off == len(cr.data) {
		return n, io.EOF
	}
	return n, nil
}

// FuzzReader drives the reader the way a connection does, with calls the
// fuzzer chooses, and checks every result against the input itself: each
// line is the next line of the input, each data block the next bytes, the
// buffer never outgrows its limit, and every call either consumes input,
// reads more, or fails.
//
// ops begins with three header bytes: the buffer size, the growth limit
// and options; each following byte is one call (line, data or discard),
// data and discard taking their length from the byte after. Once ops run
// out, lines are read until the reader fails, as a connection would.
func FuzzReader(f *testing.F) {
	f.Add([]byte("set a 0 0 3\r\nabc\r\nget a\r\n"), []byte{0, 7, 200}, []byte{16, 0, 0, 0, 2, 3, 0})
	f.Add([]byte("get "+strings.Repeat("k ", 1500)+"\r\nversion\r\n"), []byte{255}, []byte{64, 255, 1})
	f.Add([]byte("set a 0 0 1 "+strings.Repeat("x", 3000)), []byte{100}, []byte{255, 255, 0})
	f.Add([]byte("a\r\n\r\n\rb\x00c\r\n\n"), []byte{0}, []byte{1, 1, 0})
	f.Add([]byte(strings.Repeat("0123456789", 100)), []byte{3, 30}, []byte{8, 4, 1, 2, 200, 3, 255, 2, 100})
	f.Add([]byte("x\r\n"+strings.Repeat(" ", 101)+"get "+strings.Repeat("y", 3000)+"\r\n"), []byte{50}, []byte{32, 255, 0})
	// The differential cases, framed as lines in 7-byte reads.
	for _, tc := range diffCases {
		if req := strings.Join(tc.chunks, ""); len(req) <= maxFuzzInput {
			f.Add([]byte(req), []byte{7}, []byte{255, 255, 1})
		}
	}
	f.Fuzz(func(t *testing.T, input, chunks, ops []byte) {
		if len(input) > maxFuzzInput || len(ops) < 3 {
			t.Skip()
		}
		size := 1 + int(ops[0])
		// The growth limit is never below the starting size, and reaches
		// past memcached's 2048-byte framing limit.
		limit := size + 16*int(ops[1])
		src := &chunkedReader{data: input, sizes: chunks, eofAtLast: ops[2]&1 == 1}
		rd := newReader(src, size, limit, func() error { return nil })
		ops = ops[3:]
		calls := len(ops)

		pos := 0 // how much of input the calls so far have consumed
		// Each step consumes input or reads more of it; anything beyond
		// that bound is a reader spinning without progress.
		for steps := 0; ; steps++ {
			if steps > 2*len(input)+calls+16 {
				t.Fatalf("no progress after %d calls at offset %d", steps, pos)
			}
			if len(rd.buf) > limit {
				t.Fatalf("buffer grew to %d bytes, limit %d", len(rd.buf), limit)
			}
			if src.emptyReads > 0 {
				t.Fatal("reader called Read with no room in its buffer")
			}
			op := byte(0)
			n := 0
			if len(ops) > 0 {
				op, ops = ops[0]%4, ops[1:]
				if op >= 2 && len(ops) > 0 {
					n, ops = 3*int(ops[0]), ops[1:]
				}
			}
			switch op {
			case 2:
				b, err := rd.data(n)
				if err != nil {
					checkShortInput(t, "data", err, input, pos, n)
					return
				}
				if want := input[pos : pos+n]; !bytes.Equal(b, want) {
					t.Fatalf("data(%d) at offset %d = %q, want %q", n, pos, b, want)
				}
				pos += n
			case 3:
				if err := rd.discard(n); err != nil {
					checkShortInput(t, "discard", err, input, pos, n)
					return
				}
				pos += n
			default:
				line, err := rd.line()
				switch {
				case err == nil:
					rest := input[pos:]
					nl := bytes.IndexByte(rest, '\n')
					if nl < 0 || pos+nl >= src.off {
						t.Fatalf("line() = %q at offset %d before its newline was read", line, pos)
					}
					if bytes.IndexByte(line, '\n') >= 0 {
						t.Fatalf("line() = %q holds a newline", line)
					}
					if want := memcachedLine(rest[:nl]); !bytes.Equal(line, want) {
						t.Fatalf("line() at offset %d = %q, want %q", pos, line, want)
					}
					pos += nl + 1
				case err == errNeedMore:
					before := src.off
					rd.park() // as a connection does before it waits
					err := rd.fill()
					switch {
					case err == nil:
						if src.off == before {
							t.Fatal("fill() returned without reading")
						}
					case err == io.EOF:
						if src.off != len(input) {
							t.Fatalf("fill() = EOF at %d of %d input bytes", src.off, len(input))
						}
						if bytes.IndexByte(input[pos:], '\n') >= 0 {
							t.Fatalf("fill() = EOF with a whole line at offset %d unread", pos)
						}
						return
					case err == errLineTooLong:
						checkTooLong(t, "fill", input[pos:], limit)
						return
					default:
						t.Fatalf("fill() = %v", err)
					}
				case err == errLineTooLong:
					checkTooLong(t, "line", input[pos:], limit)
					return
				default:
					t.Fatalf("line() = %v", err)
				}
			}
		}
	})
}

// memcachedLine is what memcached makes of raw, one line without its
// newline: a carriage return goes when something precedes it, and the C
// string ends at the first NUL.
func memcachedLine(raw []byte) []byte {
	if len(raw) > 1 && raw[len(raw)-1] == '\r' {
		raw = raw[:len(raw)-1]
	}
	if z := bytes.IndexByte(raw, 0); z >= 0 {
		raw = raw[:z]
	}
	return raw
}

// checkShortInput fails unless the input really had fewer than n bytes
// left at pos when a data block of n bytes could not be had.
func checkShortInput(t *testing.T, call string, err error, input []byte, pos, n int) {
	t.Helper()
	if err != io.EOF {
		t.Fatalf("%s(%d) = %v", call, n, err)
	}
	if pos+n <= len(input) {
		t.Fatalf("%s(%d) = EOF at offset %d with %d bytes of input left", call, n, pos, len(input)-pos)
	}
}

// checkTooLong fails when rest was refused as an unframable line though
// memcached would have framed it: its first line must be longer than 2048
// bytes (and not a retrieval command), or fill the largest buffer allowed.
func checkTooLong(t *testing.T, call string, rest []byte, limit int) {
	t.Helper()
	n := bytes.IndexByte(rest, '\n')
	if n < 0 {
		n = len(rest)
	}
	trimmed := bytes.TrimLeft(rest, " ")
	retrieval := len(rest)-len(trimmed) <= 100 &&
		(bytes.HasPrefix(trimmed, []byte("get ")) || bytes.HasPrefix(trimmed, []byte("gets ")))
	if n > lineLimit && !retrieval || n >= limit {
		return
	}
	t.Fatalf("%s() refused a %d-byte line (retrieval %v, buffer limit %d): %.80q", call, n, retrieval, limit, rest)
}

// FuzzProxy sends arbitrary bytes to a proxy in front of a real memcached.
// Whatever arrives, the proxy must not crash, must end the connection once
// the client has sent everything, and must go on serving other clients.
func FuzzProxy(f *testing.F) {
	for _, tc := range diffCases {
		// The two cases with 100 KB and 1 MiB values exceed maxFuzzInput
		// and would only be skipped.
		if req := strings.Join(tc.chunks, ""); len(req) <= maxFuzzInput {
			f.Add([]byte(req))
		}
	}
	for _, garbage := range []string{
		"\x00\xff\xfe\r\n",
		"\r\n\r\n\r\n\n\n\r",
		// binary-protocol get
		"\x80\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00a",
		// TLS client hello
		"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\x9c\x1b\x00\x00",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"set a 0 0 10\r\nabc",
		"set a 0 0 2147483645\r\n",
		"get " + strings.Repeat("a ", 2000),
		"gat 1 k\xff\x80\x7f k\x01 \xc3\xa9\r\n",
		"mg a v\r\nms a 1\r\nx\r\nme a\r\n",
		"stats\r\nstats items\r\nstats reset\r\nflush_all 1 noreply\r\nquit\r\n",
	} {
		f.Add([]byte(garbage))
	}
	mc := startMemcached(f)
	_, addr := startProxy(f, testConfig(mc))
	checks := 0
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > maxFuzzInput {
			t.Skip()
		}
		reply, err := converse(addr, input, 5*time.Second)
		switch {
		case err == nil:
			if n := len(reply.tail); n > 0 && !bytes.HasSuffix(reply.tail, crlf) {
				t.Errorf("reply of %d bytes ends mid-line: …%q", reply.total, reply.tail)
			}
		case errors.Is(err, syscall.ECONNRESET):
			// The proxy closed with input still unread (after quit or a
			// framing error), so the kernel reset the connection.
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("connection still open 5s after the client finished sending; got %d bytes: %q", reply.total, reply.head)
		default:
			t.Fatalf("talking to the proxy: %v", err)
		}

		// The input may have sent "flush_all <delay>", which would make
		// memcached hide items stored up to that moment; clear it first.
		if flushed, err := converse(mc, []byte("flush_all\r\n"), 5*time.Second); err != nil || string(flushed.head) != "OK\r\n" {
			t.Fatalf("resetting memcached: %q, %v", flushed.head, err)
		}
		checks++
		key := "fuzz-check-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(checks)
		value := strconv.Itoa(checks)
		req := fmt.Sprintf("set %s 0 0 %d\r\n%s\r\nget %s\r\n", key, len(value), value, key)
		want := fmt.Sprintf("STORED\r\nVALUE %s 0 %d\r\n%s\r\nEND\r\n", key, len(value), value)
		got, err := converse(addr, []byte(req), 5*time.Second)
		if err != nil || string(got.head) != want {
			t.Fatalf("after the input the proxy answered set and get with %q (%v), want %q", got.head, err, want)
		}
	})
}

// replyRecord keeps the start and the end of what a server sent, so that a
// large reply costs no memory.
type replyRecord struct {
	head  []byte
	tail  []byte
	total int
}

func (r *replyRecord) Write(p []byte) (int, error) {
	r.total += len(p)
	if room := 1024 - len(r.head); room > 0 {
		r.head = append(r.head, p[:min(room, len(p))]...)
	}
	r.tail = append(r.tail, p[max(0, len(p)-2):]...)
	r.tail = r.tail[max(0, len(r.tail)-2):]
	return len(p), nil
}

// converse writes input to addr on a new connection, half-closes it, and
// reads until the server closes or wait passes. Writing runs beside
// reading, so a server busy answering never waits on the client, and its
// errors are ignored: the server may close before it has read everything.
func converse(addr string, input []byte, wait time.Duration) (*replyRecord, error) {
	r := &replyRecord{}
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		return r, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	written := make(chan struct{})
	go func() {
		defer close(written)
		c.Write(input)
		c.(*net.TCPConn).CloseWrite()
	}()
	_, err = io.Copy(r, c)
	<-written
	return r, err
}
