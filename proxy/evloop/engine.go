package evloop

import (
	"log/slog"
	"net"
	"sync"
)

// Engine is a set of event loops sharing one Handler.
type Engine struct {
	loops []*Loop
	once  sync.Once
}

// New starts cfg.Loops event loops that report to h.
func New(cfg Config, h Handler) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ReadBuffer == 0 {
		cfg.ReadBuffer = defaultReadBuffer
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{}
	for range cfg.Loops {
		l, err := newLoop(&cfg, h)
		if err != nil {
			e.Stop()
			return nil, err
		}
		e.loops = append(e.loops, l)
		go l.run()
	}
	return e, nil
}

// Enroll hands nc to the loop with the fewest connections; see
// Loop.Enroll.
func (e *Engine) Enroll(nc net.Conn, ctx any) (*Conn, error) {
	best := e.loops[0]
	least := best.count.Load()
	for _, l := range e.loops[1:] {
		if n := l.count.Load(); n < least {
			best, least = l, n
		}
	}
	return best.Enroll(nc, ctx)
}

// Stop stops every loop and returns once they have stopped: the tasks
// queued before it run, then each connection still open is closed, its
// OnClose told nil. Execute and Enroll fail with ErrStopped from the
// start of Stop on. Stop must not be called on a loop's goroutine.
func (e *Engine) Stop() {
	e.once.Do(func() {
		for _, l := range e.loops {
			l.stop()
		}
		for _, l := range e.loops {
			<-l.done
		}
	})
}
