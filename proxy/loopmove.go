package proxy

import (
	"errors"
	"runtime"
	"sync/atomic"

	"mcsidecar/proxy/evloop"
)

// Clients that read long replies are spread over loops of their own; the
// others stay together on the first.
//
// One loop reads, answers and writes every request of its clients on one
// thread. For short requests that is the cheapest way there is: what the
// loop reads in one poll goes upstream in one write, and a second loop
// would halve those batches and add its own wake-ups (on the comparison's
// load 1, with a goroutine-per-connection client, two loops cost a third
// more CPU a request for 5 % more requests a second). A client that reads
// hundreds of kilobytes a request (a store-gateway's 100-key gets of
// postings) is another matter: every byte of its replies is read from
// memcached and written to it by its loop, and on a busy machine one
// thread, given one thread's share of the processors, is where every
// such client waits (on the `dm` load, two loops served 1.48× the
// requests of one at 0.9× the CPU a request). And a light request behind
// a heavy one on the same loop waits for it.
//
// So a loop keeps count of its heavy clients, those whose retrievals'
// replies have lately averaged loopHeavyReply bytes or more. With
// --event-loops -1 every client begins on the first loop, which keeps
// the light ones, and a heavy client leaves it, between two requests
// (nothing owed, nothing unread), for the other loop with the fewest
// heavy clients; one there moves again only to a loop with at least two
// fewer than its own, and one turned light goes back to the first. Those
// other loops run at a lower OS priority than the first (heavyNice): on a
// busy machine the kernel runs the light clients' loop first, and a light
// request waits less behind the heavy ones of other clients. With
// --event-loops N clients begin on the loop with the fewest connections
// and heavy ones are balanced over all N the same way. A loop of heavy
// clients only rebuilds their postings itself: only a loop that serves
// light clients too gives that work to the workers (see loopaside.go),
// at a lower priority than the loops'.

// loopHeavyReply is the mean reply, in bytes, from which a client is heavy;
// it is light again below half of it.
const loopHeavyReply = 64 << 10

// loopsMove: the poller moves connections between loops (epoll does, the
// portable poller does not).
const loopsMove = evloop.Poller == "epoll"

// loopMoveAlways, for tests, moves every client to the next loop each time
// it has nothing owed, heavy or not: every path then runs across moves.
var loopMoveAlways atomic.Bool

// noteReply takes a retrieval reply of n bytes into the client's mean, and
// counts the client heavy or light on its loop.
func (lc *loopClient) noteReply(n int) {
	lc.replyMean += (n - lc.replyMean) / 8
	switch {
	case !lc.heavy && lc.replyMean >= loopHeavyReply:
		lc.heavy = true
		lc.ls.heavy.Add(1)
	case lc.heavy && lc.replyMean < loopHeavyReply/2:
		lc.heavy = false
		lc.ls.heavy.Add(-1)
	}
}

// mayMove has the loop look at the client at the end of the poll, when it
// may move (see moveClients); the client has nothing owed.
func (lc *loopClient) mayMove() {
	if lc.moving || (!lc.heavy && !lc.ls.heavyOnly && !loopMoveAlways.Load()) || !loopsMove || len(lc.ls.l.cli.Loops()) < 2 {
		return
	}
	lc.moving = true
	lc.ls.moving = append(lc.ls.moving, lc)
}

// moveClients moves the clients mayMove noted that still may, where they
// should go. It runs at the end of a poll, outside every connection's
// callbacks.
func (ls *loopState) moveClients() {
	for i, lc := range ls.moving {
		ls.moving[i] = nil
		lc.moving = false
		if !lc.idle() {
			continue
		}
		if dst := ls.moveTarget(lc); dst != nil {
			ls.move(lc, dst)
		}
	}
	ls.moving = ls.moving[:0]
}

// serveHeavyOnly, on the loop's goroutine before it has clients, makes it
// a loop of heavy clients only, whose thread runs at a lower priority for
// the rest of its life: the runtime ends the thread with the loop.
func (ls *loopState) serveHeavyOnly() {
	ls.heavyOnly = true
	if lowersPriority {
		runtime.LockOSThread()
		lowerPriority(heavyNice)
	}
}

// servesLight reports whether the loop has clients other than heavy ones.
func (ls *loopState) servesLight() bool { return int(ls.heavy.Load()) < len(ls.clients) }

// idle reports whether the client can change loops: open over plain TCP,
// reading, nothing owed, read or held on either side.
func (lc *loopClient) idle() bool {
	return lc.gc != nil && lc.tls == nil && len(lc.slots) == 0 && !lc.held && !lc.quit && !lc.ended &&
		!lc.inBlock() && lc.buffered() == 0 && lc.gc.OutboundBuffered() == 0 && lc.gc.Reading() &&
		!lc.c.p.draining()
}

// moveTarget returns the loop a client should go to, or nil.
func (ls *loopState) moveTarget(lc *loopClient) *loopState {
	loops := ls.l.cli.Loops()
	if loopMoveAlways.Load() {
		for i, el := range loops {
			if el == ls.el {
				return ls.l.state(loops[(i+1)%len(loops)])
			}
		}
		return nil
	}
	if !lc.heavy {
		if ls.heavyOnly {
			return ls.l.state(loops[0])
		}
		return nil
	}
	var best *loopState
	least := ls.heavy.Load() - 1 // at least two fewer than here
	first := ls.l.p.firstLoop
	if first && ls.el == loops[0] {
		least = 1 << 30 // the first loop keeps no heavy client
	}
	for _, el := range loops {
		if el == ls.el || first && el == loops[0] {
			continue
		}
		o := ls.l.state(el)
		if n := o.heavy.Load(); n < least {
			best, least = o, n
		}
	}
	return best
}

// move hands the client to the loop dst. When that fails it stays, or,
// short of being busy, is closed: the loop is stopping, or epoll failed.
func (ls *loopState) move(lc *loopClient, dst *loopState) {
	delete(ls.clients, lc)
	if lc.heavy {
		ls.heavy.Add(-1)
		dst.heavy.Add(1)
	}
	// OnOpen on dst takes it in; should dst fail to, its OnClose runs
	// there, with the client dst's.
	lc.ls = dst
	err := lc.gc.MoveTo(dst.el)
	if err == nil {
		ls.l.p.stats.ClientMoves.Add(1)
		return
	}
	lc.ls = ls
	ls.clients[lc] = struct{}{}
	if lc.heavy {
		dst.heavy.Add(-1)
		ls.heavy.Add(1)
	}
	if !errors.Is(err, evloop.ErrBusy) {
		ls.l.p.log.Debug("client closed: it could not move to another loop", "err", err)
		lc.gc.Close()
	}
}
