package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mcsidecar/proxy/internal/wire"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxFuzzInput bounds one fuzz input, so that a run explores many small
// requests rather than a few large ones.
const maxFuzzInput = 64 << 10

// FuzzProxy sends arbitrary bytes to a proxy in front of a real memcached.
// Whatever arrives, the proxy must not crash, must end the connection once
// the client has sent everything, must answer only in memcached's reply
// grammar (checkReplies), and must go on serving other clients.
func FuzzProxy(f *testing.F) {
	for _, tc := range slices.Concat(diffCases, metaDiffCases) {
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
			if n := len(reply.tail); n > 0 && !bytes.HasSuffix(reply.tail, wire.CRLF) {
				t.Errorf("reply of %d bytes ends mid-line: …%q", reply.total, reply.tail)
			}
			if reply.all != nil {
				if err := checkReplies(reply.all, input); err != nil {
					t.Errorf("%v; reply %q", err, short(string(reply.all)))
				}
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

// maxCheckedReply bounds the reply FuzzProxy keeps whole to check its
// grammar; a larger one (many gets of a large value) is only counted.
const maxCheckedReply = 1 << 20

// replyRecord keeps the start and the end of what a server sent, so that a
// large reply costs no memory, and all of it while it stays within
// maxCheckedReply (all is nil past that).
type replyRecord struct {
	head  []byte
	tail  []byte
	all   []byte
	total int
}

func (r *replyRecord) Write(p []byte) (int, error) {
	r.total += len(p)
	if r.total <= maxCheckedReply {
		r.all = append(r.all, p...)
	} else {
		r.all = nil
	}
	if room := 1024 - len(r.head); room > 0 {
		r.head = append(r.head, p[:min(room, len(p))]...)
	}
	r.tail = append(r.tail, p[max(0, len(p)-2):]...)
	r.tail = r.tail[max(0, len(r.tail)-2):]
	return len(p), nil
}

// checkReplies returns an error unless reply is a sequence of whole
// memcached text replies: the fixed lines, an error line with its message,
// VERSION, STAT, a number (incr and decr), and VALUE lines followed by
// exactly the data block they announce and then another VALUE or END. A
// VALUE must name a key the client sent, never the rewritten upstream key,
// and its numbers must be what memcached writes.
func checkReplies(reply, input []byte) error {
	inValues := false // the previous reply was a VALUE block
	for off := 0; off < len(reply); {
		nl := bytes.IndexByte(reply[off:], '\n')
		if nl < 1 || reply[off+nl-1] != '\r' {
			return fmt.Errorf("reply at offset %d is no CRLF-terminated line", off)
		}
		line := reply[off : off+nl-1]
		next := off + nl + 1
		word, _, _ := bytes.Cut(line, []byte(" "))
		if bytes.IndexByte(line, '\r') >= 0 && !metaCode(word) {
			return fmt.Errorf("reply line %q at offset %d holds a carriage return", line, off)
		}
		if inValues && string(word) != "VALUE" && string(word) != "END" && string(word) != "SERVER_ERROR" {
			return fmt.Errorf("values end with %q at offset %d, not END", line, off)
		}
		inValues = false
		switch string(word) {
		case "STORED", "NOT_STORED", "EXISTS", "NOT_FOUND", "DELETED", "TOUCHED", "END", "OK", "RESET":
			if len(line) != len(word) {
				return fmt.Errorf("reply line %q at offset %d has words after %s", line, off, word)
			}
		case "ERROR", "CLIENT_ERROR", "SERVER_ERROR", "VERSION", "STAT":
			if string(word) != "ERROR" && len(line) <= len(word)+1 {
				return fmt.Errorf("reply line %q at offset %d has nothing after %s", line, off, word)
			}
		case "HD", "EN", "NF", "NS", "EX", "MN", "ME":
			// Meta replies: the code, then flag words.
			for _, f := range bytes.Split(line, []byte(" "))[1:] {
				if len(f) > 1 && (f[0] == 'O' || f[0] == 'k') && bytes.Contains(input, f[1:]) {
					continue // an opaque or key echoed as sent, any byte in it, as memcached does
				}
				if len(f) == 0 || bytes.ContainsFunc(f, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
					return fmt.Errorf("meta reply %q at offset %d has a malformed word", line, off)
				}
			}
		case "VA":
			f := bytes.Split(line, []byte(" "))
			if len(f) < 2 || !decimal(f[1], 31) {
				return fmt.Errorf("VA line %q at offset %d has no size", line, off)
			}
			n, _ := strconv.Atoi(string(f[1]))
			if next+n+2 > len(reply) || !bytes.Equal(reply[next+n:next+n+2], wire.CRLF) {
				return fmt.Errorf("VA line %q at offset %d is not followed by %d bytes and CRLF", line, off, n)
			}
			next += n + 2
		case "VALUE":
			f := bytes.Split(line, []byte(" "))
			if len(f) != 4 && len(f) != 5 {
				return fmt.Errorf("VALUE line %q at offset %d has %d words", line, off, len(f))
			}
			key := f[1]
			if len(key) == 0 || len(key) > 250 || !bytes.Contains(input, key) {
				return fmt.Errorf("VALUE line %q at offset %d names a key the client did not send", line, off)
			}
			if !decimal(f[2], 32) || !decimal(f[3], 31) || len(f) == 5 && !decimal(f[4], 64) {
				return fmt.Errorf("VALUE line %q at offset %d has a malformed number", line, off)
			}
			n, _ := strconv.Atoi(string(f[3]))
			if next+n+2 > len(reply) || !bytes.Equal(reply[next+n:next+n+2], wire.CRLF) {
				return fmt.Errorf("VALUE line %q at offset %d is not followed by %d bytes and CRLF", line, off, n)
			}
			next += n + 2
			inValues = true
		default:
			if !decimal(line, 64) {
				return fmt.Errorf("unknown reply line %q at offset %d", line, off)
			}
		}
		off = next
	}
	if inValues {
		return errors.New("reply ends after values without END")
	}
	return nil
}

// metaCode reports whether word is a meta reply's code: its line may echo
// an opaque or key holding a carriage return.
func metaCode(word []byte) bool {
	switch string(word) {
	case "HD", "EN", "NF", "NS", "EX", "VA":
		return true
	}
	return false
}

// decimal reports whether b is a number as memcached writes one: digits
// only, no sign, no leading zero, fitting in bits.
func decimal(b []byte, bits int) bool {
	if len(b) == 0 || len(b) > 1 && b[0] == '0' || b[0] < '0' || b[0] > '9' {
		return false
	}
	_, err := strconv.ParseUint(string(b), 10, bits)
	return err == nil
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

// TestCheckReplies shows that FuzzProxy's reply grammar refuses what a
// broken proxy could send, and accepts what memcached sends.
func TestCheckReplies(t *testing.T) {
	input := []byte("set a 0 0 2\r\nhi\r\nget a b\r\nincr n 1\r\nstats\r\n")
	for _, good := range []string{
		"",
		"STORED\r\nVALUE a 0 2\r\nhi\r\nEND\r\n",
		"VALUE a 0 2 17\r\nhi\r\nVALUE b 4294967295 0\r\n\r\nEND\r\n",
		"ERROR\r\nCLIENT_ERROR bad data chunk\r\nNOT_FOUND\r\n18446744073709551615\r\nSTAT pid 1\r\nEND\r\n",
		"VERSION 1.6.0-mcsidecar-test\r\nSERVER_ERROR upstream timeout\r\n",
	} {
		if err := checkReplies([]byte(good), input); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	for _, bad := range []string{
		"STORED\n",                              // no carriage return
		"STORED\r\nEND",                         // cut mid-line
		"STORED x\r\n",                          // words after a fixed reply
		"VALUE a 0 3\r\nhi\r\nEND\r\n",          // block shorter than announced
		"VALUE a 0 1\r\nhi\r\nEND\r\n",          // block longer than announced
		"VALUE a 0 2\r\nhi\r\n",                 // no END
		"VALUE a 0 2\r\nhi\r\nSTORED\r\n",       // no END
		"VALUE ~x7f 0 2\r\nhi\r\nEND\r\n",       // a key the client never sent
		"VALUE a -1 2\r\nhi\r\nEND\r\n",         // negative flags
		"VALUE a 4294967296 2\r\nhi\r\nEND\r\n", // flags over 32 bits
		"VALUE a 0 02\r\nhi\r\nEND\r\n",         // leading zero
		"VALUE a 0\r\nEND\r\n",                  // too few words
		"12a\r\n",                               // not a number
		"HELLO\r\n",                             // no such reply
		"STAT\r\n",                              // nothing after STAT
		"ST\rORED\r\n",                          // stray carriage return
	} {
		if err := checkReplies([]byte(bad), input); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
