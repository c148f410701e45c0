package proxy

import (
	"math"
	"slices"
	"syscall"
	"unsafe"

	"mcsidecar/proxy/internal/sockio"
)

// written writes the client's replies that are ready, in order, and hands
// the connection over once nothing is owed when that was asked.
func (lc *loopClient) written() {
	if lc.inProcess || lc.writing {
		// process writes what is ready when it ends; a write that
		// closes the connection calls back in here through closed(),
		// and the loop below goes on with the connection closed.
		return
	}
	st := lc.c.p.stats
	n := 0
	lc.writing = true
	for n < len(lc.slots) && lc.slots[n].pending == 0 {
		s := lc.slots[n]
		if !s.noreply && lc.full() {
			lc.hold()
			for _, s := range lc.slots[n:] {
				if s.pending == 0 {
					lc.ls.detach(s, s.out)
				}
			}
			break
		}
		rest := s.out
		if !s.noreply && lc.gc != nil && !lc.ls.l.abandon.Load() {
			rest = lc.send(s.out)
			if len(rest) > 0 && lc.gc != nil {
				// The socket and evloop took what they take for now:
				// the rest stays in the slot, where it is, until evloop
				// holds less (see full).
				s.out = rest
				lc.charge(s, bufsLen(rest))
				continue
			}
		}
		st.Latency[s.id].Observe(lc.ls.now.Sub(s.began).Seconds())
		lc.charge(s, 0) // given to the socket or to evloop, or dropped
		lc.ls.putSlot(s)
		lc.slots[n] = nil
		n++
	}
	lc.writing = false
	lc.noteOut()
	if n == 0 {
		return
	}
	lc.slots = append(lc.slots[:0], lc.slots[n:]...)
	lc.last = lc.ls.now
	if len(lc.slots) > 0 || lc.gc == nil {
		return
	}
	if lc.c.p.draining() && lc.buffered() == 0 {
		// A connection is not closed inside its own OnTraffic:
		// traffic closes it by its return. A draining proxy answers the
		// requests it has read first.
		if !lc.inTraffic && lc.gc.OutboundBuffered() == 0 {
			lc.gc.Close()
		}
		return
	}
	if lc.buffered() > 0 {
		lc.processHeld() // requests held back while too many replies were owed
		return
	}
	lc.mayMove()
}

// loopOutMax is the most bytes of a client's replies evloop holds, written
// once the socket has room. A client that reads its replies slower than
// that makes the loop hold its next replies where they are and answer no
// more of its requests, until evloop holds less again (checked at the end
// of each poll of its loop, and every loopTick); so a client that sends
// gets and reads no replies costs the proxy what it sent, up to
// loopUnreadMax, not the replies.
const loopOutMax = loopCopyMax

// full reports whether evloop holds so much of the client's replies that
// the next must wait.
func (lc *loopClient) full() bool {
	return lc.gc != nil && lc.gc.OutboundBuffered() > loopOutMax
}

// loopCopyMax is the most bytes of a reply the loop copies into evloop's
// buffer at a time when the client's socket does not take it all at once.
// A longer rest stays in its slot, in the buffers it is in, and is given
// a part at a time as evloop writes the one before (see written and
// full): a slow reader of a long reply costs no copy of all of it.
const loopCopyMax = 256 << 10

// send writes a reply: straight to the socket when nothing waits before
// it, and what the socket does not take into evloop's buffer, which writes
// it once the socket has room, up to loopCopyMax bytes. It returns the
// rest it did not give, or nil.
func (lc *loopClient) send(out [][]byte) [][]byte {
	if lc.tls != nil {
		lc.sendTLS(out)
		return nil
	}
	n, rest, _ := lc.put(out, loopCopyMax)
	lc.c.p.stats.BytesWritten.Add(uint64(n))
	return rest
}

// sendTLS writes a reply over TLS: encrypted whole, so that its pieces do
// not each make a record, and put as send puts a plain one, except that
// evloop takes whatever the socket does not, however long (the goroutine
// path could not go on with a TLS session whose record was half written).
func (lc *loopClient) sendTLS(out [][]byte) {
	t := lc.tls
	plain := lc.ls.sealBuf[:0]
	for _, b := range out {
		plain = append(plain, b...)
	}
	lc.ls.sealBuf = plain[:0]
	if cap(plain) > tlsKeepMax {
		lc.ls.sealBuf = nil
	}
	if _, err := t.conn.Write(plain); err != nil {
		lc.closeSelf()
		return
	}
	lc.c.p.stats.BytesWritten.Add(uint64(len(plain)))
	lc.putSealed()
}

// putSealed writes the records TLS wrote to the bridge, as put writes a
// reply, except that evloop takes whatever the socket does not.
func (lc *loopClient) putSealed() {
	t := lc.tls
	sealed := t.b.out
	if len(sealed) == 0 {
		return
	}
	t.b.out = sealed[:0]
	if cap(sealed) > tlsKeepMax {
		t.b.out = nil
	}
	lc.put([][]byte{sealed}, math.MaxInt)
}

// put writes bufs straight to the socket when evloop holds none of the
// client's bytes (and has a socket to give: not the portable poller), and gives evloop the rest the socket does not take, up to
// copyMax bytes; when evloop holds some, it gives evloop up to copyMax. It
// returns how many bytes it wrote or gave evloop and the rest it did not,
// or ok false when the write failed, which closes the connection.
func (lc *loopClient) put(bufs [][]byte, copyMax int) (n int, rest [][]byte, ok bool) {
	gc := lc.gc
	if fd := gc.Fd(); fd >= 0 && gc.OutboundBuffered() == 0 {
		var err error
		var iov []syscall.Iovec
		bufs, n, iov, err = sockio.WriteSome(fd, bufs, lc.iov)
		lc.iov = iov
		if err != nil {
			lc.closeSelf()
			return n, nil, false
		}
	}
	give, rest := cutBufs(bufs, copyMax)
	if len(give) > 0 {
		m, _ := gc.Writev(give)
		n += m
	}
	return n, rest, true
}

// cutBufs splits bufs after its first n bytes, in the middle of a buffer
// if need be. rest is a slice of bufs, whose first buffer it may shorten.
func cutBufs(bufs [][]byte, n int) (head, rest [][]byte) {
	for i, b := range bufs {
		if n == 0 {
			return bufs[:i:i], bufs[i:]
		}
		if len(b) > n {
			head = append(bufs[:i:i], b[:n])
			bufs[i] = b[n:]
			return head, bufs[i:]
		}
		n -= len(b)
	}
	return bufs, nil
}

// detach copies the upstream replies of slot s out of the chunks they
// were read into, points the pieces of out (s's reply, or what is left of
// it) into the copies, and lets go of the chunks: a client that the loop
// holds back (see full) keeps
// its replies' bytes, not the chunks they share with everyone else's.
// Each upstream reply is copied once, so a value that the reply names
// many times (a key repeated in one get) is still held once; and a reply
// that has a chunk to itself, at least half full, is not copied at all:
// the slot keeps the chunk, which nothing else reads into.
func (ls *loopState) detach(s *loopSlot, out [][]byte) {
	for _, r := range s.reqs {
		if r.share == nil || r.share.Refs == 1 && 2*len(r.buf) >= cap(r.share.Buf) {
			continue
		}
		b := slices.Clone(r.buf)
		for i, piece := range out {
			if off, ok := within(piece, r.buf); ok {
				out[i] = b[off : off+len(piece) : off+len(piece)]
			}
		}
		ls.pool.Release(r.share)
		r.share, r.buf = nil, b
	}
}

// within reports whether piece lies inside buf, and where it begins there.
func within(piece, buf []byte) (int, bool) {
	if len(piece) == 0 || len(buf) == 0 {
		return 0, false
	}
	off := int(uintptr(unsafe.Pointer(&piece[0])) - uintptr(unsafe.Pointer(&buf[0])))
	return off, off >= 0 && off+len(piece) <= len(buf)
}

// bufsLen is how many bytes bufs holds.
func bufsLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
