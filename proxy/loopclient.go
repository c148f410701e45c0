package proxy

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/zones"
)

// loopClient is one client connection on a loop.
type loopClient struct {
	c         *conn
	gc        *evloop.Conn
	ls        *loopState
	slots     []*loopSlot // replies owed, in request order
	hangUp    bool        // the command read is an HTTP request
	quit      bool        // the client sent quit: the connection closes, nothing more is read
	ended     bool        // the client ended its side: it closes once answered (see readEnd)
	inProcess bool        // process is running: replies made meanwhile are written when it ends
	inTraffic bool        // in the client's own OnTraffic, which closes it by its return
	writing   bool        // written is running
	held      bool        // replies or requests wait until evloop holds fewer bytes of replies (loopOutMax)
	inHeld    bool        // in loopState.held
	unread    int         // bytes buffered that were already counted
	last      time.Time
	iov       []syscall.Iovec
	// replyMean is a moving mean of its retrievals' reply bytes; heavy,
	// whether it counts as heavy on its loop, and moving, whether it is
	// in the loop's moving (see loopmove.go).
	replyMean     int
	heavy, moving bool
	tls           *loopTLS // the connection's TLS server, with --tls-cert-path
	// What the client is owed (see output.go): the bytes its slots are
	// charged, the bytes evloop held for it when last looked at, a key's
	// share of its replies lately, at most, and the keys of the retrieval
	// it is held back at (0: none).
	charged, outSeen, perKey, need int
	// want is how many bytes the first request buffered needs before it
	// is parsed again: a storage command whose value is still arriving,
	// or 0. evloop gathers a long value from many reads, and parsing it
	// after each would copy all of it that came so far each time.
	want int
	// skip is how many bytes of a data block still to come are dropped:
	// the rest of a value refused as too large (see tooLarge).
	skip int
	// pend, over plain TCP, is instead the first request buffered when
	// it is a storage command of at least loopPendMin bytes whose value
	// is still arriving and half of which has come: the bytes come so
	// far, with the request's length for capacity, in pendSh's chunk or,
	// under a chunk's size, an array of their own. The rest is read
	// straight into it (ReadInto), and the request handled from it once
	// whole.
	pend   []byte
	pendSh *chunks.Share
}

// loopPendMin is the length from which a storage command (line, value and
// CRLF) whose value has not all come in one read gathers in a buffer of its
// own, which the rest is read straight into (loopClient.pend), rather than
// in evloop's buffer, from which it would be copied twice more. It does once
// half of it has come: memory follows what arrives, not what a request
// says will (a buffer for a request of n bytes holds up to 2n).
const loopPendMin = 64 << 10

// loopMaxSlots is how many replies one client may owe before the loop
// stops reading its requests until some are written.
const loopMaxSlots = 256

// loopUnreadMax is the most bytes of requests a client may have sent that
// the loop is not answering yet, because it owes loopMaxSlots replies or
// the client reads its replies too slowly: past it the loop stops reading
// the client's socket until half of them are answered, as memcached
// reads no more requests than it answers, and the client waits.
const loopUnreadMax = 16 * loopReadBuffer

// traffic handles every request that has arrived whole.
func (lc *loopClient) traffic() evloop.Action {
	var readErr error
	if lc.tls != nil {
		readErr = lc.tls.read(lc.gc)
		if lc.putSealed(); lc.gc == nil {
			return evloop.None // the write of TLS's own answer failed
		}
	}
	n := lc.buffered()
	if n > lc.unread {
		lc.c.p.stats.BytesRead.Add(uint64(n - lc.unread))
	}
	lc.inTraffic = true
	lc.process()
	lc.inTraffic = false
	if lc.gc == nil {
		return evloop.None // a write failed and closed the connection
	}
	if lc.quit {
		return lc.leave()
	}
	lc.unread = lc.buffered()
	switch {
	case readErr == nil:
	case readErr == io.EOF && (len(lc.slots) > 0 || lc.unread > 0 || lc.gc.OutboundBuffered() > 0):
		// The client ended its TLS session after requests not all
		// answered: as a plain client that half-closes, it is answered,
		// and its session ended once the replies are written.
		return lc.leave()
	default:
		// Ended with nothing owed, or broken: closed at once.
		return evloop.Close
	}
	lc.pace()
	if len(lc.slots) == 0 && lc.c.p.draining() && lc.gc.OutboundBuffered() == 0 && !lc.inBlock() {
		return evloop.Close // what written leaves to this callback's return
	}
	return evloop.None
}

// pace stops reading the client's socket while it sent more requests
// than the loop lets wait (see loopUnreadMax), and reads it again once
// they are down to half, or once nothing is owed or held: then what is
// buffered is the start of a request, whose rest must be read.
func (lc *loopClient) pace() {
	if lc.quit || lc.ended {
		return // nothing more is read (see leave and readEnd)
	}
	waiting := len(lc.slots) > 0 || lc.held
	switch reading := lc.gc.Reading(); {
	case reading && waiting && lc.unread > loopUnreadMax:
		lc.gc.PauseReading()
		lc.c.p.stats.ClientReadPauses.Add(1)
	case !reading && (!waiting || lc.unread <= loopUnreadMax/2):
		lc.gc.ResumeReading()
	}
}

// unhandled returns the bytes gc brought that are not handled yet: evloop's,
// or with TLS (t) the decrypted ones.
func unhandled(gc *evloop.Conn, t *loopTLS) []byte {
	if t != nil {
		return t.plain
	}
	b := gc.Peek()
	return b
}

// handle drops the first n bytes of unhandled(gc, t).
func handle(gc *evloop.Conn, t *loopTLS, n int) {
	if t != nil {
		t.took(n)
	} else if n > 0 {
		gc.Discard(n)
	}
}

// inBlock reports whether the first request buffered is a storage
// command whose value is still arriving (see want and pend). A shutdown
// lets it come: the request is in flight.
func (lc *loopClient) inBlock() bool { return lc.want > 0 || lc.pend != nil || lc.skip > 0 }

// buffered is how many request bytes arrived and are not handled yet.
func (lc *loopClient) buffered() int {
	if lc.tls != nil {
		return len(lc.tls.plain)
	}
	return len(lc.pend) + lc.gc.InboundBuffered()
}

// process answers the whole requests buffered, up to loopMaxSlots owed.
func (lc *loopClient) process() {
	if lc.inProcess || lc.quit {
		return
	}
	if lc.waits() {
		lc.hold()
		return
	}
	if lc.want > 0 {
		if n := lc.buffered(); n < lc.want && !lc.pendable(lc.want, n) {
			return
		}
		lc.want = 0
	}
	lc.inProcess = true
	first := len(lc.slots) // the replies to this read
	if lc.pend != nil && (len(lc.slots) >= loopMaxSlots || !lc.gather()) {
		lc.inProcess = false
		return
	}
	data := unhandled(lc.gc, lc.tls)
	off := min(lc.skip, len(data)) // the rest of a data block refused
	lc.skip -= off
	for off < len(data) && len(lc.slots) < loopMaxSlots {
		n := lc.request(data[off:])
		if lc.hangUp {
			// memcached hangs up on an HTTP request without sending the
			// replies to the commands read with it.
			for _, s := range lc.slots[first:] {
				s.noreply = true
			}
			lc.hangUp = false
		}
		if n == 0 {
			break // wants more bytes
		}
		off += n
		if lc.quit {
			break
		}
	}
	if off > 0 {
		handle(lc.gc, lc.tls, off)
		if off > len(lc.pend) { // not only the start of a request
			lc.last = lc.ls.now
		}
	}
	if cap(lc.c.words) > shrinkKeep {
		lc.c.words = nil // grown by a get of unusually many keys
	}
	lc.inProcess = false
	if len(lc.slots) > 0 && lc.slots[0].pending == 0 {
		lc.written() // replies made here: version, a request to an ejected server
	}
}

// closeSelf closes the connection: whatever is owed is dropped (see
// closed).
func (lc *loopClient) closeSelf() {
	lc.gc.Close()
}

// leave closes a client that quit, or broke memcached's framing, or sent
// an HTTP request, or ended its side, once the replies owed are written,
// as memcached does (a request begun and not ended is dropped): at once,
// when they are, returning Close for a callback to return; otherwise its
// socket is read no more and finishEnded closes it once they are.
func (lc *loopClient) leave() evloop.Action {
	if lc.answeredAll() && lc.tls == nil {
		return evloop.Close
	}
	if !lc.ended {
		lc.ended = true
		lc.gc.PauseReading()
		lc.ls.ending = append(lc.ls.ending, lc)
	}
	return evloop.None
}

// answeredAll reports whether a client that ended its side has nothing
// more coming: no reply owed or held back, and evloop holds none of its
// bytes. No whole request is left then: process answers every one unless
// a reply is owed or it is held.
func (lc *loopClient) answeredAll() bool {
	return len(lc.slots) == 0 && !lc.held && lc.gc.OutboundBuffered() == 0
}

// finishEnded closes the clients that ended their side and have been
// answered, at the end of a poll, when the last of their bytes may have
// been written, and at each tick.
func (ls *loopState) finishEnded() {
	ls.ending = slices.DeleteFunc(ls.ending, func(lc *loopClient) bool {
		if _, open := ls.clients[lc]; !open || lc.gc == nil {
			return true
		}
		if !lc.answeredAll() {
			return false
		}
		if t := lc.tls; t != nil && !t.ended {
			// The session ends with close_notify, written before the
			// connection closes.
			t.ended = true
			t.conn.CloseWrite()
			if lc.putSealed(); lc.gc == nil || lc.gc.OutboundBuffered() > 0 {
				return lc.gc == nil
			}
		}
		lc.closeSelf()
		return true
	})
}

// resumeHeld resumes the clients held back that evloop has written enough
// of the replies of: a write of the poll that ended may have been theirs.
// The rest wait for a later poll, or for the tick.
func (ls *loopState) resumeHeld() {
	held := ls.held
	ls.held = ls.heldSpare[:0]
	for _, lc := range held {
		if _, open := ls.clients[lc]; !open || !lc.held {
			lc.inHeld = false // closed, or resumed by the tick
			continue
		}
		if lc.waits() {
			ls.held = append(ls.held, lc)
			continue
		}
		lc.inHeld = false
		lc.resume()
	}
	clear(held)
	ls.heldSpare = held[:0]
}

// hold holds the client's replies and requests back until evloop holds
// fewer of its replies than loopOutMax, and the retrieval it is held back
// at, if any, fits (see waits).
func (lc *loopClient) hold() {
	lc.held = true
	if !lc.inHeld {
		lc.inHeld = true
		lc.ls.held = append(lc.ls.held, lc)
	}
}

// resume writes the replies a client was held back from, and answers the
// requests held back with them: once no reply is owed, or, for a client
// held back for its output limit, as soon as there is room.
func (lc *loopClient) resume() {
	room := lc.need > 0
	lc.held, lc.need = false, 0
	if len(lc.slots) > 0 {
		lc.written() // and, once none is owed, the requests held back with them
		if !room || len(lc.slots) == 0 || lc.gc == nil || lc.held {
			return
		}
	}
	lc.processHeld()
}

// processHeld runs process outside traffic, for requests held back, and
// keeps unread in step: the bytes it handled were counted as read when
// they came, and those after them must be counted when more come.
func (lc *loopClient) processHeld() {
	lc.process()
	if lc.gc == nil {
		return
	}
	if lc.quit && !lc.inTraffic {
		if lc.leave() == evloop.Close {
			lc.closeSelf()
		}
		return
	}
	lc.unread = lc.buffered()
	lc.pace()
}

// heldBehind reports whether request id waits for a request of the
// client's in flight that takes another round trip, where the new one,
// sent at once, would come first (a client's requests take effect in
// the order it sent them):
//   - every request waits for a serial one (a read-modify-write, a quiet
//     ma with N, an mg with N across zones);
//   - with zones, every request waits for a write tried zone by zone, or
//     an add to every zone, whose reply comes once the zones are in line;
//   - with zones, a write waits for a get, gets, gat, gats or mg, which
//     may yet ask another zone for a key the local one lacks;
//   - with zones and writes to every zone, a read waits for a gat, gats or
//     mg with T, which touches the other zones only once its own reads are
//     in: sent at once, the read could find a copy there that the touch
//     would have expired.
//
// A request held is parsed again once the client's replies are written.
func (lc *loopClient) heldBehind(id int) bool {
	p := lc.c.p
	// Nothing is sent upstream after a request that holds the others back
	// while it is in flight, but requests answered in place (an unknown
	// command, a refused one) may follow it: it is the last slot still
	// pending.
	var last *loopSlot
	for i := len(lc.slots) - 1; i >= 0; i-- {
		if lc.slots[i].pending > 0 {
			last = lc.slots[i]
			break
		}
	}
	if last == nil {
		return false
	}
	if last.serial {
		return true
	}
	if len(p.zones) < 2 {
		return false
	}
	if p.zoneByZone(last.kind) || last.kind == wire.CmdAdd {
		return true
	}
	if id == wire.CmdVersion {
		return false
	}
	if id == wire.CmdGet || id == wire.CmdGets || id == wire.CmdMetaGet {
		if p.cfg.ZoneWrites == zones.WritesLocal {
			return false
		}
		for _, s := range lc.slots {
			if s.pending > 0 && s.touchesZones() {
				return true
			}
		}
		return false
	}
	for _, s := range lc.slots {
		if s.pending > 0 && (s.id == wire.CmdGet || s.id == wire.CmdGets || s.id == wire.CmdMetaGet || s.touch) {
			return true
		}
	}
	return false
}

// gather moves what evloop read to pend, without a copy when it was read
// straight into place, and once pend holds the whole request, handles it.
// It reports whether it did.
func (lc *loopClient) gather() bool {
	data := unhandled(lc.gc, nil)
	n := min(len(data), cap(lc.pend)-len(lc.pend))
	if n > 0 {
		if tail := lc.pend[len(lc.pend) : len(lc.pend)+1]; &data[0] == &tail[0] {
			lc.pend = lc.pend[:len(lc.pend)+n]
			lc.c.p.stats.ClientReadsInPlace.Add(1)
		} else {
			lc.pend = append(lc.pend, data[:n]...)
		}
		handle(lc.gc, nil, n)
	}
	if len(lc.pend) < cap(lc.pend) {
		return false
	}
	if n := lc.request(lc.pend); n != len(lc.pend) {
		// pend holds one whole storage command, which takes all of it.
		panic(fmt.Sprintf("evloop: a request of %d bytes took %d", len(lc.pend), n))
	}
	lc.dropPend()
	lc.last = lc.ls.now
	return true
}

// pendable reports whether a storage command of total bytes, got of
// which have come, goes on in pend.
func (lc *loopClient) pendable(total, got int) bool {
	return lc.tls == nil && total >= loopPendMin && 2*got >= total
}

// dropPend gives back pend's chunk.
func (lc *loopClient) dropPend() {
	if lc.pendSh != nil {
		lc.ls.pool.Release(lc.pendSh)
	}
	lc.pend, lc.pendSh = nil, nil
}

// request answers the request at the start of data, or leaves it: it
// returns how many bytes it took (0: it needs more) and false for a
// request the loop does not answer.
func (lc *loopClient) request(data []byte) int {
	c := lc.c
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		if wire.Unframed(data, c.p.keyLine) || len(data) >= int(c.p.cfg.MaxRequestLine) {
			// As memcached does: the replies owed are written, and the
			// connection closed.
			c.p.log.Warn("client connection closed", "remote", remoteOf(lc.gc), "err", wire.ErrLineTooLong)
			lc.quit = true
		}
		return 0
	}
	cmd, words, v := wire.ParseLine(c.words, wire.CommandLine(data[:i]))
	c.words = words
	switch v {
	case wire.VerdictClose:
		// memcached hangs up without the replies to the commands read
		// with it, or to it: those before them are written first.
		lc.hangUp, lc.quit = true, true
		return 0
	case wire.VerdictUnknown:
		lc.local(wire.CmdUnknown, func() { c.clientError(wire.CmdUnknown, wire.LineError) })
		return i + 1
	case wire.VerdictBadArgs:
		lc.local(cmd.ID, func() { c.clientError(cmd.ID, wire.LineError) })
		return i + 1
	}
	if lc.heldBehind(cmd.ID) {
		return 0 // parsed again once the replies owed are written
	}
	switch cmd.ID {
	case wire.CmdGet, wire.CmdGets:
		if lc.outputFull(len(words) - 1) {
			return 0 // parsed again once the client has read
		}
		lc.retrieve(cmd.ID, words[1:])
		return i + 1
	case wire.CmdGat, wire.CmdGats:
		if lc.outputFull(len(words) - 2) {
			return 0 // parsed again once the client has read
		}
		lc.getAndTouch(cmd.ID, words)
		return i + 1
	case wire.CmdSet, wire.CmdAdd, wire.CmdReplace, wire.CmdAppend, wire.CmdPrepend, wire.CmdCas:
		return lc.store(cmd.ID, words, data, i+1)
	case wire.CmdDelete, wire.CmdTouch, wire.CmdIncr, wire.CmdDecr:
		lc.keyCommand(cmd.ID, words)
		return i + 1
	case wire.CmdMetaGet:
		if lc.outputFull(1) {
			return 0 // parsed again once the client has read
		}
		lc.metaGet(cmd.ID, words)
		return i + 1
	case wire.CmdMetaDebug:
		lc.metaGet(cmd.ID, words)
		return i + 1
	case wire.CmdMetaDelete:
		lc.metaDelete(words)
		return i + 1
	case wire.CmdMetaArithmetic:
		lc.metaArithmetic(words)
		return i + 1
	case wire.CmdMetaSet:
		return lc.metaSet(words, data, i+1)
	case wire.CmdVersion:
		lc.local(cmd.ID, func() { c.version() })
		return i + 1
	case wire.CmdVerbosity:
		lc.local(cmd.ID, func() { c.verbosity(words) })
		return i + 1
	case wire.CmdMetaNoop:
		lc.local(cmd.ID, func() { c.metaNoop() })
		return i + 1
	case wire.CmdStats:
		// Its counters include every request before it, as memcached's do.
		if len(lc.slots) > 0 {
			return 0 // parsed again once the replies owed are written
		}
		lc.local(cmd.ID, func() { c.stats(words) })
		return i + 1
	case wire.CmdFlushAll:
		// After the replies owed: what the client asked before it is
		// answered as before it.
		if len(lc.slots) > 0 {
			return 0
		}
		lc.flushAll(words)
		return i + 1
	case wire.CmdQuit:
		// The connection closes once the replies owed are written (see
		// leave).
		c.p.stats.Record(wire.CmdQuit, stats.OutcomeOK)
		lc.quit = true
		return i + 1
	}
	panic("evloop: a command the loop does not know: " + cmd.Name)
}

// local answers, in its place among the replies owed, a command the
// sidecar answers by itself (version, verbosity, mn, stats, a line
// memcached answers ERROR): run is the command's handler, whose reply is gathered
// into a slot.
func (lc *loopClient) local(id int, run func()) {
	c := lc.c
	s := lc.ls.slot(lc, id)
	w := replyWriter{buf: s.line[:0]}
	c.wr, c.noreply = &w, false
	run()
	c.wr = nil
	s.line, s.noreply = w.buf, c.noreply
	if len(s.line) > 0 {
		s.out = append(s.out, s.line)
	}
	lc.slots = append(lc.slots, s)
}

// takes reports whether the loop may take key, as inspect found it: one
// memcached accepts, and, without key settings, one that can go upstream
// as it is. Nothing is counted: the refusal of a key it declines is
// (conn.countRefused, or refuseKeyCommand).
func (lc *loopClient) takes(key []byte, kc keyCheck) bool {
	return kc.ok && (lc.c.p.keys != nil || wire.Forwardable(key))
}

// closed ends a client on its loop: the replies it is still owed are
// dropped.
func (lc *loopClient) closed() {
	delete(lc.ls.clients, lc)
	if lc.heavy {
		lc.ls.heavy.Add(-1)
	}
	lc.dropPend()
	lc.gc = nil
	lc.abandon()
	lc.c.p.untrack(lc.c)
	lc.noteOut() // none: evloop drops them
}

// abandon drops the replies a closed client is owed, at once those held
// back and the rest as they come.
func (lc *loopClient) abandon() {
	for _, s := range lc.slots {
		if s != nil { // a written() this close runs inside has passed it
			s.noreply = true
		}
	}
	lc.written()
}
