package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"time"

	"mcsidecar/proxy/evloop"
)

// loopTLS is TLS on one of a loop's upstream connections. crypto/tls
// reads and writes a net.Conn; here that is a bridge, which during the
// handshake (in the dialling goroutine) passes through to the socket and
// afterwards holds bytes for the loop: what evloop read from the socket,
// for the TLS client to decrypt, and what the TLS client encrypted, for
// evloop to write. A record that has not arrived whole makes the client's
// Read return errRecordPending, a temporary error, which crypto/tls keeps no
// trace of: the record's first bytes wait in the client until the rest
// comes.
type loopTLS struct {
	conn  *tls.Conn
	w     io.Writer // conn, through upstream.RequestRecords
	b     *tlsBridge
	plain []byte // decrypted bytes the loop has not taken yet
	ended bool   // the loop sent close_notify: the session is over
}

// tlsBridge is the net.Conn under a loop's TLS client.
type tlsBridge struct {
	net.Conn        // the socket, used until the handshake is over
	loop     bool   // the loop owns the socket: read in and write out
	in       []byte // bytes from the socket; TLS has read in[:off]
	off      int
	out      []byte
}

const (
	tlsRecordMax = 16 << 10 // the most plaintext a TLS record carries
	tlsKeepMax   = 64 << 10 // the most a buffer keeps between bursts
)

// errRecordPending is the bridge's read when it holds no byte: the loop reads
// again when more arrive.
var errRecordPending error = recordPending{}

type recordPending struct{}

func (recordPending) Error() string   { return "tls bridge: no bytes yet" }
func (recordPending) Timeout() bool   { return true }
func (recordPending) Temporary() bool { return true }

func (b *tlsBridge) Read(p []byte) (int, error) {
	if !b.loop && b.off == len(b.in) {
		return b.Conn.Read(p)
	}
	if b.off == len(b.in) {
		return 0, errRecordPending
	}
	n := copy(p, b.in[b.off:])
	b.off += n
	return n, nil
}

func (b *tlsBridge) Write(p []byte) (int, error) {
	if !b.loop {
		return b.Conn.Write(p)
	}
	b.out = append(b.out, p...)
	return len(p), nil
}

// Once the loop owns the socket, evloop closes it and the loop keeps time.
func (b *tlsBridge) Close() error {
	if !b.loop {
		return b.Conn.Close()
	}
	return nil
}

func (b *tlsBridge) SetDeadline(t time.Time) error {
	if !b.loop {
		return b.Conn.SetDeadline(t)
	}
	return nil
}

func (b *tlsBridge) SetReadDeadline(t time.Time) error {
	if !b.loop {
		return b.Conn.SetReadDeadline(t)
	}
	return nil
}

func (b *tlsBridge) SetWriteDeadline(t time.Time) error {
	if !b.loop {
		return b.Conn.SetWriteDeadline(t)
	}
	return nil
}

// read decrypts what evloop holds of gc onto t.plain. It returns io.EOF
// once the peer ended the session (the bytes before it are good) or the
// error that broke it. Bytes TLS itself must answer with wait in t.b.out
// for the caller to write.
func (t *loopTLS) read(gc *evloop.Conn) error {
	b := t.b
	raw := gc.Peek()
	b.in = append(b.in[:copy(b.in, b.in[b.off:])], raw...)
	b.off = 0
	gc.Discard(len(raw))
	var err error
	for {
		t.plain = slices.Grow(t.plain, tlsRecordMax)
		var n int
		n, err = t.conn.Read(t.plain[len(t.plain):cap(t.plain)])
		t.plain = t.plain[:len(t.plain)+n]
		if err != nil {
			break
		}
	}
	if errors.Is(err, errRecordPending) {
		err = nil
	}
	return err
}

// took drops the first n decrypted bytes, which the loop has read. The
// buffers of a burst larger than a few records go once it is read.
func (t *loopTLS) took(n int) {
	t.plain = t.plain[:copy(t.plain, t.plain[n:])]
	if len(t.plain) == 0 && cap(t.plain) > tlsKeepMax {
		t.plain = nil
	}
	if b := t.b; b.off == len(b.in) && cap(b.in) > tlsKeepMax {
		b.in, b.off = nil, 0
	}
}

// write encrypts requests p and writes them, in TLS records that end
// where requests end (see upstream.RequestRecords).
func (t *loopTLS) write(gc *evloop.Conn, p []byte) error {
	if _, err := t.w.Write(p); err != nil {
		return err
	}
	t.send(gc)
	return nil
}

// send writes what the TLS client wrote to the bridge. A failed write
// closes gc there and then, as every other write on the loop.
func (t *loopTLS) send(gc *evloop.Conn) {
	b := t.b
	if len(b.out) == 0 {
		return
	}
	out := b.out
	b.out = nil
	gc.Write(out)
	if b.out == nil && cap(out) <= tlsKeepMax {
		b.out = out[:0]
	}
}
