package proxy

import (
	"bytes"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// replies reads the replies that have arrived and answers their requests,
// in order.
func (u *loopUpstream) replies() {
	gc, t := u.gc, u.tls
	var readErr error // the end of a TLS session, after the replies in it
	if t != nil {
		readErr = t.read(gc)
		if t.send(gc); u.gc != gc {
			return // the write of TLS's own answer failed
		}
	}
	data := unhandled(gc, t)
	off := 0
	for u.sent > 0 && off < len(data) {
		r := u.q.front()
		u.takeChunk(0, 0)
		n, whole, bad := u.scan.Feed(data[off:], r.want())
		u.adopt()
		off += n
		if bad != nil {
			u.outOfStep(bad)
			return
		}
		if !whole {
			break
		}
		reply, vals := u.scan.Acc, u.scan.Vals
		reply, err, bad := u.checkReply(r, reply, vals)
		if bad != nil {
			u.outOfStep(bad)
			return
		}
		u.q.pop()
		u.sent--
		ends := r.ends
		// The requests that share r's get line share its reply.
		joined := append(u.joined[:0], r)
		for range r.joined {
			q := u.q.front()
			joined = append(joined, q)
			ends = ends || q.ends
			u.q.pop()
			u.sent--
		}
		u.joined = joined // its array serves the next reply
		if u.sent > 0 {
			u.q.front().waitFrom = u.ls.now // its reply may begin now
		}
		if !r.store && !r.meta && len(r.asked) <= loopJoinKeys {
			// A mean over about the last eight replies to requests
			// that may join a line.
			u.replyMean += (len(reply)/len(joined) - u.replyMean) / 8
		}
		if err != nil && u.batchErr == nil {
			u.batchErr = err
		}
		if ends {
			// A batch counts once in the server's requests, with the
			// first error a reply in it was.
			u.srv.Record(r.began, u.batchErr)
			u.batchErr = nil
			u.batches--
		}
		// The next reply begins where this one ends, in the same chunk.
		u.scan.Next()
		switch {
		case err != nil:
			for _, q := range joined {
				q.done(nil, err)
			}
		case r.drop > 0:
			u.ls.l.p.countDropped(r, reply, nil)
			u.dropped(r)
		case r.store:
			r.done(reply, nil) // which copies what it keeps
		case r.meta:
			u.chunk.Refs++
			r.share = u.chunk
			r.done(reply[:len(reply):len(reply)], nil)
		default:
			u.chunk.Refs += len(joined)
			u.ls.answerJoined(joined, u.chunk, reply, vals)
		}
		clear(joined)
		if u.gc != gc {
			// A flush made while answering found the connection broken:
			// evloop closed it there, and OnClose failed what was queued.
			// What was queued since goes out on a new one.
			u.flush()
			return
		}
	}
	handle(gc, t, off)
	if len(u.scan.Acc) == 0 {
		u.dropChunk() // no reply is being read: the next read takes one again
	}
	if readErr != nil {
		u.abort(readErr)
		return
	}
	// What answering queued goes out in OnPollEnd.
}

// Reading replies into chunks: each read of a connection goes into the
// chunk its reply is gathered in, after the bytes of it read before, and
// a reply a client is owed stays where it was read, referring to its
// chunk (loopReq.share) until it is written. The bytes of a reply are
// copied only when its chunk has too little room left for the next read:
// what is read of it so far moves to a new chunk.

// loopChunkRoom is the least room a read is given in a chunk.
const loopChunkRoom = 32 << 10

// takeChunk has the connection read into a chunk with room for at least n
// more bytes, taking one when it has none. A reply that has to move goes
// to a chunk of at least size bytes, and of twice what it has so far, so
// that a long reply, of many values, moves a few times, not once a read.
func (u *loopUpstream) takeChunk(n, size int) {
	acc := u.scan.Acc
	if u.chunk != nil && cap(acc)-len(acc) >= n {
		return
	}
	size = max(size, len(acc)+n, 2*len(acc))
	if u.chunk == nil {
		u.chunk = u.ls.pool.Get(size)
		u.scan.Acc = u.chunk.Buf[:0]
		return
	}
	u.moveTo(size)
}

// moveTo moves what is read of the reply being read to a chunk of at
// least size bytes.
func (u *loopUpstream) moveTo(size int) {
	acc := u.scan.Acc
	sh := u.ls.pool.Get(size)
	u.scan.Acc = append(sh.Buf[:0], acc...)
	u.ls.pool.Release(u.chunk)
	u.chunk = sh
}

// adopt makes a larger array the reply being read moved to (appended to
// past the end of its chunk, or grown for a long value) the connection's
// chunk.
func (u *loopUpstream) adopt() {
	acc, buf := u.scan.Acc, u.chunk.Buf
	if _, ok := within(acc[:cap(acc)], buf[:cap(buf)]); ok {
		return // still in the chunk
	}
	u.ls.pool.Release(u.chunk)
	u.chunk = u.ls.pool.Adopt(acc)
}

// dropChunk gives up the connection's hold on its chunk, and the reply
// being read.
func (u *loopUpstream) dropChunk() {
	if u.chunk != nil {
		u.ls.pool.Release(u.chunk)
		u.chunk = nil
	}
	u.scan = upstream.ReplyScan{Vals: u.scan.Spare()}
}

// room returns where the connection's next read goes: the rest of its
// chunk, at least loopChunkRoom bytes, and for a long value, as much of
// it as one read straight into place takes (direct), with
// loopChunkRoom after it, so that the bytes after the value do not move
// it. A reply moved for a long value moves to a chunk with room for all
// of the value, up to the largest chunk the loop keeps: memory follows
// what arrives, not what a reply says will.
func (u *loopUpstream) room() []byte {
	want, size := loopChunkRoom, 0
	if len(u.scan.Acc) == 0 && u.sent > 0 {
		// A reply begins: room for as long a one as they have been, so
		// that a long one is read whole where it begins, not moved; no
		// more than a chunk the loop keeps, so that a short reply after
		// long ones does not take an array of their size for itself.
		want = max(want, min(u.replyMean+u.replyMean/4, chunks.KeepMax))
	}
	n := direct(&u.scan)
	if n > 0 {
		want = n + loopChunkRoom
		size = len(u.scan.Acc) + min(u.scan.Need, chunks.KeepMax) + loopChunkRoom
	}
	u.takeChunk(want, size)
	acc := u.scan.Acc
	if n == 0 {
		return acc[len(acc):cap(acc)]
	}
	u.ls.l.p.stats.UpstreamReadsInPlace.Add(1)
	return acc[len(acc) : len(acc)+n]
}

// loopDirectMin is the least of a value still to come that the loop reads
// straight into the buffer its reply is gathered in, rather than into
// evloop's read buffer, from which it would copy it; loopDirectMax the most
// one read takes so. Below evloop's own read size, reading only the value
// would take more reads when replies come back to back.
const (
	loopDirectMin = loopReadBuffer
	loopDirectMax = 4 * loopReadBuffer
)

// direct returns how many bytes of a long value the next read takes
// straight into place, or 0 while no long value is being read.
func direct(r *upstream.ReplyScan) int {
	if r.Need < loopDirectMin {
		return 0
	}
	return min(r.Need, loopDirectMax)
}

// upstreamReply maps an error from an upstream request to the reply for
// the client and the request's outcome: a CLIENT_ERROR or SERVER_ERROR line
// the server sent where the proxy expected another reply (the meta
// commands of a read-modify-write) is relayed as it was sent; anything else
// is an upstream failure.
func upstreamReply(err error) ([]byte, stats.Outcome) {
	if line, ok := upstream.RelayedLine(err.Error()); ok {
		if bytes.Equal(line, wire.LineTooLarge) {
			// The server's item limit, not a failure of the server.
			return line, stats.OutcomeClientError
		}
		return line, stats.OutcomeUpstreamError
	}
	if upstream.IsTimeout(err) {
		return wire.LineUpstreamSlow, stats.OutcomeUpstreamError
	}
	return wire.LineUpstreamDown, stats.OutcomeUpstreamError
}
