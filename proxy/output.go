package proxy

import "mcsidecar/proxy/internal/wire"

// What a client is owed: the replies it has not read.
//
// A client that sends requests and reads no replies must not make the
// proxy hold their replies without end: a hundred pipelined gets of
// megabyte values are a hundred megabytes. Each connection may be owed at
// most --max-client-output-bytes: the replies made and not yet given to
// the socket, the replies an event loop holds to write once the
// socket has room, and the replies of the retrievals asked upstream and
// not answered yet, which are charged before they come at what the
// client's replies have been per key (see estimate), and at their own
// length once made. At the limit the loop asks nothing more for the
// client: the retrieval that would pass it waits, unparsed, with what
// the client sent after it, until the client has read enough; one that
// goes on sending is no longer read once it has sent loopUnreadMax bytes
// the loop is not answering (see pace). One retrieval is always
// answered when nothing else is owed, however long its reply: memcached
// answers a get whole too. A client whose replies wait on it for
// --idle-timeout is closed, and counted.

// defaultMaxClientOutput is --max-client-output-bytes' default: a few
// replies of the longest values memcached holds by default (1 MiB), and
// the loopUnreadMax of requests a client that does not read may send.
const defaultMaxClientOutput = 4 << 20

// estimate is what a retrieval of n keys is charged until its reply is
// made: n times the longest a key's share of this client's replies has
// lately been. Before the client's first reply it is the whole limit,
// which lets one retrieval at a time go until a reply tells: what other
// clients read says nothing of what this one asks for.
func (lc *loopClient) estimate(n int) int {
	if lc.perKey == 0 {
		return lc.ls.l.outMax
	}
	return n * lc.perKey
}

// owed is how many bytes of replies the client is owed: those charged,
// and those evloop holds for it.
func (lc *loopClient) owed() int {
	n := lc.charged
	if lc.gc != nil {
		n += lc.gc.OutboundBuffered()
	}
	return n
}

// fits reports whether a retrieval charged est may be asked now: nothing
// is owed, or what is owed with it stays within the limit.
func (lc *loopClient) fits(est int) bool {
	owed := lc.owed()
	return owed == 0 || owed+est <= lc.ls.l.outMax
}

// outputFull reports whether a retrieval of n keys must wait for the
// client to read, and then holds the client back until it fits (see
// waits).
func (lc *loopClient) outputFull(n int) bool {
	n = max(n, 1)
	if lc.fits(lc.estimate(n)) {
		lc.need = 0
		return false
	}
	lc.need = n
	lc.hold()
	return true
}

// waits reports whether a client held back must wait on: evloop holds too
// many of its replies (full), or the retrieval it was held back at does
// not fit yet, at what it would be charged now, and no reply of its is
// ready to be written, as the rest of a long one given a part at a time.
func (lc *loopClient) waits() bool {
	if lc.full() {
		return true
	}
	ready := len(lc.slots) > 0 && lc.slots[0].pending == 0
	return lc.need > 0 && !ready && !lc.fits(lc.estimate(lc.need))
}

// charge sets what slot s is charged against its client to n bytes.
func (lc *loopClient) charge(s *loopSlot, n int) {
	d := n - s.charge
	s.charge = n
	lc.charged += d
	lc.ls.charged += d
	if d > 0 {
		lc.ls.notePeak()
	}
}

// made charges a retrieval's reply, once made, at its length, and learns
// from it what a key's share of a reply is (see estimate): the longest
// lately, forgotten by an eighth a reply.
func (lc *loopClient) made(s *loopSlot) {
	n := bufsLen(s.out)
	lc.charge(s, n)
	lc.noteReply(n)
	keys := len(s.owners)
	if s.id == wire.CmdMetaGet {
		keys = 1
	}
	if keys == 0 {
		return
	}
	per := max(n/keys, 1)
	lc.perKey = max(per, lc.perKey-lc.perKey/8)
}

// noteOut takes in the loop's count how many bytes evloop holds for the
// client now (none once it is closed): evloop writes them without telling,
// so the count is what it held when last looked at, no less.
func (lc *loopClient) noteOut() {
	n := 0
	if lc.gc != nil {
		n = lc.gc.OutboundBuffered()
	}
	lc.ls.out += n - lc.outSeen
	lc.outSeen = n
	lc.ls.notePeak()
}

// closeIdle closes a client that completed no request, or read none of
// its replies, for --idle-timeout: counted as idle, and when evloop still
// holds replies for it, as a client that left them unread.
func (lc *loopClient) closeIdle() {
	st := lc.c.p.stats
	st.ConnsIdleClosed.Add(1)
	if lc.gc.OutboundBuffered() > 0 {
		st.ConnsOutputClosed.Add(1)
	}
	lc.gc.Close()
}

// notePeak records the most bytes the loop has been owed by its clients
// at once, for the tests that bound it.
func (ls *loopState) notePeak() {
	if n := ls.charged + ls.out; n > ls.peakSeen {
		ls.peakSeen = n
		ls.peak.Store(int64(n))
	}
}

// outputPeak returns the most bytes of replies the loops' clients have
// been owed at once, summed over the loops.
func (l *eventLoops) outputPeak() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ls := range l.loops {
		n += int(ls.peak.Load())
	}
	return n
}

// replyWriter gathers the reply a handler writes (stats, version, a
// refusal, a meta reply made from memcached's), which the loop then puts
// in its place among the client's replies (see loopClient.local).
type replyWriter struct {
	buf []byte
}

// Write appends b to the reply. It never fails.
func (w *replyWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	return len(b), nil
}
