package evloop

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
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

// Loops returns the engine's loops, in the order they were started.
func (e *Engine) Loops() []*Loop { return e.loops }

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

// loopBase is the part of a Loop both pollers share: the Handler and the
// optional interfaces it implements, the Config's NoDelay and Log, the
// count Engine.Enroll balances, and the task queue.
type loopBase struct {
	h        Handler
	pollEnd  PollEnder  // h, when it is one
	readInto ReadIntoer // h, when it is one
	readEnd  ReadEnder  // h, when it is one
	noDelay  bool
	log      *slog.Logger

	// count is the connections on the loop or on their way to it, which
	// Engine.Enroll balances.
	count atomic.Int32

	mu       sync.Mutex
	tasks    []func() // tasks (and, portable, outcomes), in the order they came
	spare    []func() // the array the loop ran tasks from last
	stopping bool     // Execute refuses tasks
	done     chan struct{}
}

// newLoopBase looks up, once, which optional interfaces h implements.
func newLoopBase(cfg *Config, h Handler) loopBase {
	pollEnd, _ := h.(PollEnder)
	readInto, _ := h.(ReadIntoer)
	readEnd, _ := h.(ReadEnder)
	return loopBase{
		h:        h,
		pollEnd:  pollEnd,
		readInto: readInto,
		readEnd:  readEnd,
		noDelay:  cfg.NoDelay,
		log:      cfg.Log,
		done:     make(chan struct{}),
	}
}

// Execute runs f on the loop's goroutine after what the loop is handling
// now (with epoll, the events of its current or next wait), in the order
// tasks were given. It fails, and f never runs, once the loop stops. A
// task may call every method of the loop's connections.
func (l *Loop) Execute(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return ErrStopped
	}
	l.tasks = append(l.tasks, f)
	l.signal()
	return nil
}

// Enroll moves nc onto the loop and returns once the handler's OnOpen
// has run there; ctx is the connection's Context. nc is closed if it
// fails; with epoll, the loop takes a duplicate of nc's socket and nc is
// closed whatever the outcome. It must not be called on a loop's
// goroutine.
func (l *Loop) Enroll(nc net.Conn, ctx any) (*Conn, error) {
	l.count.Add(1)
	c, err := l.enroll(nc, ctx)
	if err != nil {
		l.count.Add(-1)
	}
	return c, err
}

// runAndWait runs f on the loop's goroutine and returns its error once it
// has run, or ErrStopped when the loop stops without running it.
func (l *Loop) runAndWait(f func() error) error {
	ran := make(chan error, 1)
	if err := l.Execute(func() { ran <- f() }); err != nil {
		return err
	}
	select {
	case err := <-ran:
		return err
	case <-l.done:
		select {
		case err := <-ran:
			return err
		default:
			return ErrStopped // the loop stopped without running the task
		}
	}
}

// runTasks runs the tasks queued so far and reports how many there were
// and whether the loop is to stop. Tasks they queue run in a later round.
func (l *loopBase) runTasks() (n int, stop bool) {
	l.mu.Lock()
	tasks := l.tasks
	l.tasks = l.spare[:0]
	stop = l.stopping
	l.mu.Unlock()
	for i, f := range tasks {
		f()
		tasks[i] = nil
	}
	l.spare = tasks[:0]
	return len(tasks), stop
}

// dropTasks has Execute refuse tasks from now on and drops those still
// queued when the loop stops.
func (l *loopBase) dropTasks() {
	l.mu.Lock()
	l.stopping = true
	clear(l.tasks)
	l.tasks = nil
	l.mu.Unlock()
}
