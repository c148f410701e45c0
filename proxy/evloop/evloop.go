// Package evloop runs stream connections on event loops: each loop is one
// goroutine that calls a Handler as its connections' bytes arrive, one
// call at a time. It is the small part of an event-loop library the proxy
// needs: connections are accepted or dialled elsewhere and enrolled, and
// nothing else (no listeners, timers or UDP) is offered.
//
// On Linux a loop waits on epoll for its sockets, reads them when they are
// readable and writes what a socket does not take once it has room. Other
// systems, and Linux builds with the tag evloop_portable, use the portable
// poller instead: a reader and a writer goroutine a connection, doing
// blocking reads and writes and handing their outcomes to the loop, which
// calls the Handler exactly as on epoll. The Handler cannot tell them
// apart, except that Fd is -1 with the portable poller.
package evloop

import (
	"errors"
	"log/slog"
)

// Action is what a callback asks of the loop once it returns.
type Action int

const (
	// None leaves the connection as it is.
	None Action = iota
	// Close closes the connection once the callback has returned.
	Close
)

// Handler is told what happens to a loop's connections. Every call runs
// on the connection's loop goroutine, one at a time per loop.
type Handler interface {
	// OnOpen is called once a connection is on its loop, before any of its
	// bytes is read.
	OnOpen(c *Conn) Action
	// OnTraffic is called after each read that brought bytes: Peek shows
	// them, after those left unread before.
	OnTraffic(c *Conn) Action
	// OnClose is called once when the connection closes: err is nil when
	// the handler or the loop's stop closed it, and says why otherwise
	// (io.EOF, wrapped, when the peer ended it). The connection's buffers
	// are still there: what it holds to write is written once more as
	// far as the socket takes it, after OnClose returns, and the socket
	// is closed then.
	OnClose(c *Conn, err error)
}

// PollEnder is a Handler that is told each time a loop has handled every
// event one wait returned and run the tasks queued by then, just before it
// waits again: work the events made, such as writes to other connections,
// can be done once for all of them there. A task it queues runs after the
// next wait.
type PollEnder interface {
	OnPollEnd(l *Loop)
}

// ReadIntoer is a Handler that may choose, connection by connection, the
// buffer the next read goes into instead of the loop's own: a long message
// then lands where it is kept, without a copy out of the loop's buffer.
// ReadInto is called before each read; a non-empty buffer takes at most
// its length, nil reads into the loop's buffer. Bytes OnTraffic leaves
// unread are copied out of it, so it may be reused once OnTraffic returns.
// A buffer given while earlier bytes are still unread saves nothing: Peek
// then copies the new bytes after the old ones.
type ReadIntoer interface {
	ReadInto(c *Conn) []byte
}

// ReadEnder is a Handler that is told when the peer ends its side of a
// connection (a read finds the end of the stream) instead of the
// connection closing then: it may still write to the peer, and closes the
// connection when it is done, or at once by returning Close. The socket is
// not read again: ResumeReading does nothing after the end.
type ReadEnder interface {
	OnReadEnd(c *Conn) Action
}

// Config says how many loops to run and how they treat their sockets.
type Config struct {
	// Loops is the number of event loops, at least 1.
	Loops int
	// ReadBuffer is the most bytes one read takes into a loop's own
	// buffer (0: 64 KiB). Each loop has one.
	ReadBuffer int
	// NoDelay sets TCP_NODELAY on every TCP connection enrolled.
	NoDelay bool
	// Log receives the errors no caller sees (a failed epoll_wait, a
	// socket that would not close); nil drops them.
	Log *slog.Logger
}

const defaultReadBuffer = 64 << 10

// ErrBusy is what Conn.MoveTo returns for a connection that holds bytes
// read or to write, or is not being read.
var ErrBusy = errors.New("evloop: connection busy")

// ErrStopped is what Execute and Enroll return once the engine or the
// loop stops.
var ErrStopped = errors.New("evloop: stopped")

func (cfg *Config) validate() error {
	switch {
	case cfg.Loops < 1:
		return errors.New("evloop: at least one loop")
	case cfg.ReadBuffer < 0:
		return errors.New("evloop: negative read buffer")
	}
	return nil
}
