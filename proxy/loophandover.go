package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/sockio"
)

// closed ends a client on its loop. A connection that asked for a command
// the loop does not answer, or that closed its side with requests still
// buffered or replies owed, goes on in the goroutine path: evloop closes its
// descriptor after this returns, so it continues on a duplicate, and
// writes first what evloop held and dropped (see unwritten).
func (lc *loopClient) closed(err error) {
	c := lc.c
	delete(lc.ls.clients, lc)
	defer lc.dropPend() // once its bytes are handed over
	defer lc.noteOut()  // none: evloop drops them, or they are handed over
	gc := lc.gc
	kept := lc.kept
	lc.kept = nil
	unread := lc.buffered()
	if err != nil && !errors.Is(err, io.EOF) {
		lc.closing = true // a read or write failed: no one is left to answer
	}
	if lc.ls.l.abandon.Load() {
		lc.closing = true // the loops are stopping: an Execute may never run
	}
	if !lc.closing && lc.counted && (lc.handoff || err != nil) {
		flushWhileProgress(gc) // the less evloop holds, the less to hand over
	}
	end := func() { // the connection ends here, its replies dropped
		lc.gc = nil
		lc.abandon()
		c.p.untrack(c)
	}
	held := gc.OutboundBuffered()
	if lc.closing || !lc.handoff && (err == nil || len(lc.slots) == 0 && unread == 0 && held == 0) {
		end()
		return
	}
	h := &handover{replies: make(chan [][]byte, len(lc.slots))}
	if held > 0 {
		if err := lc.unwritten(gc, kept, h); err != nil {
			if lc.counted {
				c.p.log.Warn("client connection closed: replies evloop holds cannot be handed over", "remote", remoteOf(c.nc), "err", err)
			}
			end()
			return
		}
	}
	// The bytes of a request begun in pend come first.
	prefix := append(append([]byte(nil), lc.pend...), unhandled(gc, lc.tls)...)
	fd, derr := gc.Dup()
	if derr != nil {
		end()
		return
	}
	lc.gc = nil
	c.p.stats.connsHandedOver.Add(1)
	if len(lc.slots) > 0 {
		lc.hand = h
		lc.written() // the replies held back go first
	} else {
		close(h.replies)
	}
	l := lc.ls.l
	go func() {
		defer c.p.untrack(c)
		f := os.NewFile(uintptr(fd), "client")
		nc, err := net.FileConn(f)
		f.Close()
		if err == nil {
			// From here a shutdown that gave up waiting reaches the
			// socket (it closes the connections' sockets under wakeMu
			// after it set abandon), or this sees it gave up.
			c.wakeMu.Lock()
			c.nc = nc
			if l.abandon.Load() {
				err = net.ErrClosed
			}
			c.wakeMu.Unlock()
		}
		if err == nil && h.tail != nil {
			if err = h.writeTail(nc, l.stopped, c.p.cfg.IdleTimeout); errors.Is(err, os.ErrDeadlineExceeded) {
				c.p.stats.connsIdleClosed.Add(1)
				c.p.stats.connsOutputClosed.Add(1)
			}
		}
		if err != nil {
			if nc != nil {
				nc.Close()
			}
			for range h.replies {
			}
			return
		}
		if t := lc.tls; t != nil {
			// The TLS session goes on over the new socket, after the
			// bytes the loop read but did not decrypt.
			t.b.Conn, t.b.loop = nc, false
			nc = t.conn
		}
		c.adopt(nc, prefix)
		for b := range h.replies {
			bufs := net.Buffers(b)
			if err := c.cc.writeBuffers(&bufs); err != nil {
				for range h.replies {
				}
				nc.Close()
				return
			}
		}
		c.serve()
	}()
}

// flushWhileProgress has evloop write what it holds for gc for as long as
// the socket takes some.
func flushWhileProgress(gc *evloop.Conn) {
	for b := gc.OutboundBuffered(); b > 0; {
		gc.Flush()
		if a := gc.OutboundBuffered(); a < b {
			b = a
		} else {
			break
		}
	}
}

// unwritten puts in h the bytes of replies evloop holds for gc, the end of
// kept, which evloop drops when it closes its descriptor after one more
// write, with how many bytes the socket had been given then.
func (lc *loopClient) unwritten(gc *evloop.Conn, kept []byte, h *handover) error {
	held := gc.OutboundBuffered()
	switch {
	case !lc.counted:
		return errors.ErrUnsupported // a socket that does not count what it was given
	case held > len(kept):
		return errors.New("evloop holds bytes not kept")
	}
	wrote, err := sockio.Written(gc.Fd())
	if err != nil {
		return err
	}
	done := make(chan struct{})
	// evloop's last write and close happen before the loop runs this.
	err = lc.ls.el.Execute(func() {
		close(done)
	})
	if err != nil {
		return err
	}
	h.tail = append([]byte(nil), kept[len(kept)-held:]...)
	h.wrote, h.loopDone = wrote, done
	return nil
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

// handover carries the replies a client is owed to the goroutine that
// goes on with it, in order; it is closed after the last. Bytes of replies
// evloop held when it closed its descriptor go before them: tail, of which
// evloop's last write may have taken some after the socket had been given
// wrote bytes in all; loopDone is closed once that write is over.
type handover struct {
	replies  chan [][]byte
	tail     []byte
	wrote    uint64
	loopDone chan struct{}
}

// writeTail writes the bytes of tail that evloop's last write did not take,
// straight to the socket (over TLS they are records already), within
// timeout if there is one, unless the loops stopped first. They were
// counted when evloop took them.
func (h *handover) writeTail(nc net.Conn, stopped <-chan struct{}, timeout time.Duration) error {
	select {
	case <-h.loopDone:
	case <-stopped:
		return net.ErrClosed // the loops stopped before they ran the signal
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return errors.New("handover: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var now uint64
	cerr := rc.Control(func(fd uintptr) { now, err = sockio.Written(int(fd)) })
	if err = errors.Join(cerr, err); err != nil {
		return err
	}
	took := now - h.wrote
	if now < h.wrote || took > uint64(len(h.tail)) {
		return fmt.Errorf("handover: the socket took %d bytes after evloop held %d", int64(took), len(h.tail))
	}
	if timeout > 0 {
		nc.SetWriteDeadline(time.Now().Add(timeout))
	}
	_, err = nc.Write(h.tail[took:])
	h.tail = nil
	return err
}
