package upstream

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"time"
)

// Options are what every server of a set is built with: the upstream
// flags of the proxy, its logger and its counters.
type Options struct {
	Timeout        time.Duration // one request, or one batch, end to end
	ConnectTimeout time.Duration // a dial and its TLS handshake
	MaxIdleConns   int           // idle connections kept per server
	FailureLimit   int           // consecutive failures that eject; 0 never ejects
	RetryInterval  time.Duration // between probes of an ejected server
	GetConcurrency int           // batches in flight per server
	GetBatchKeys   int           // keys in one batch at most
	// MetaGets asks for every get with mg, for the time to live of each
	// hit too: the local tier keeps a value only as long as memcached
	// would.
	MetaGets bool
	// TLS returns the TLS configuration of a new server's connections;
	// nil, or a nil configuration, is plain TCP.
	TLS    func() (*tls.Config, error)
	Log    *slog.Logger
	Totals Totals
}

// Server is one upstream memcached: its connection pool, the coalescer
// that pipelines every client's requests to it in batches, and its health,
// which every request passes.
type Server struct {
	name   string
	pipe   *coalescer // every request but flush_all and the envelope's
	raw    *rawPool
	health *health
	up     *serverStats

	// For DialLoop: a dial without TLS, and the TLS configuration.
	dialPlain      func(context.Context, string, string) (net.Conn, error)
	tls            *tls.Config
	connectTimeout time.Duration
}

// NewServer returns the server named name, host:port or unix:/path as in
// --upstream. It connects only when a request needs a connection.
func NewServer(name string, o *Options) (*Server, error) {
	network, addr, err := splitUpstream(name)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: o.ConnectTimeout}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, addr)
	}
	var tlsCfg *tls.Config
	if o.TLS != nil {
		if tlsCfg, err = o.TLS(); err != nil {
			return nil, err
		}
	}
	host, _, _ := net.SplitHostPort(addr) // empty for a unix socket
	tlsCfg = tlsFor(tlsCfg, host)
	up := newServerStats(name, o.Totals)
	raw := &rawPool{dial: withTLS(dial, tlsCfg, o.ConnectTimeout), timeout: o.Timeout, connectTimeout: o.ConnectTimeout, maxIdle: o.MaxIdleConns}
	h := newHealth(name, o, raw.probe)
	raw.health = h
	s := &Server{
		name:           name,
		raw:            raw,
		health:         h,
		up:             up,
		dialPlain:      dial,
		tls:            tlsCfg,
		connectTimeout: o.ConnectTimeout,
	}
	raw.outOfStep = s.OutOfStep
	s.pipe = newCoalescer(s.raw, up, o.GetConcurrency, o.GetBatchKeys)
	s.pipe.r.Meta = o.MetaGets
	return s, nil
}

// Name returns the server as --upstream or DNS named it.
func (s *Server) Name() string { return s.name }

// Get runs call on the server, pipelined with other clients' requests,
// and returns once call has its items, or its reply line, or Err.
func (s *Server) Get(call *Call) { s.pipe.get(call) }

// Begin starts call's fetch for a request that asks other servers too,
// without waiting for the reply, and reports whether call leads its batch:
// a leader has its batch gathered on a connection, to be written by
// Call.WriteNow or as End begins to read; a call that must wait in line is
// queued. End completes it.
func (s *Server) Begin(call *Call) bool { return s.pipe.begin(call) }

// End completes what Begin started; led is what Begin returned.
func (s *Server) End(call *Call, led bool) { s.pipe.end(call, led) }

// Send starts one request r for call's keys, not coalesced with other
// clients' requests and without waiting for its replies: Finish reads
// them. Call.WriteNow writes it before Finish does.
func (s *Server) Send(r Retrieval, call *Call) {
	call.batch = append(call.batch[:0], call)
	call.began = time.Now()
	call.pend = s.raw.send(r, call.batch)
}

// Finish reads the replies to what Send sent, into call's items and Err.
func (s *Server) Finish(r Retrieval, call *Call) {
	call.Err = s.raw.finish(r, call.batch, call.pend)
	s.up.observe(call.began, call.Err)
	call.pend = pending{}
	clear(call.batch)
	call.batch = call.batch[:0]
}

// Observe counts one request to the server that began at start and ended
// with err, for a request made without Get, Begin or Send.
func (s *Server) Observe(start time.Time, err error) { s.up.observe(start, err) }

// Admit returns the error a request to an ejected server fails with, or
// nil while the server takes requests.
func (s *Server) Admit() error { return s.health.admit() }

// Record counts one request made on a connection of the caller's own (an
// event loop's) that began at start and ended with err: in the server's
// statistics and in its health, which ejects the server at the failure
// limit. A request refused by Admit is counted with Observe instead.
func (s *Server) Record(start time.Time, err error) {
	s.up.observe(start, err)
	s.health.observe(err)
}

// CountGet counts keys keys asked in a get request sent on a connection
// of the caller's own, and the request, unless joined says the keys
// joined one already counted.
func (s *Server) CountGet(keys int, joined bool) {
	if !joined {
		s.up.all.Gets.Add(1)
	}
	s.up.all.GetKeys.Add(uint64(keys))
}

// CountServerError counts a SERVER_ERROR reply to one command that was
// otherwise answered.
func (s *Server) CountServerError() { s.up.serverError() }

// FlushAll sends flush_all, with the delay when one was given.
func (s *Server) FlushAll(delay int32, withDelay bool) error {
	return s.raw.flushAll(delay, withDelay)
}

// Ping asks the server for its version, the cheapest request it answers.
// An ejected server is not asked: it does not answer.
func (s *Server) Ping() error { return s.raw.ping() }

// GetForUpdate reads key's item for a read-modify-write: its value, into
// dst grown once to its size, and its flags, CAS value and time to live.
// found is false on a miss.
func (s *Server) GetForUpdate(key string, dst []byte) (value []byte, it MetaItem, found bool, err error) {
	return s.raw.getForUpdate(key, dst)
}

// StoreIfUnchanged writes value under key only if the item still has
// it.CAS, keeping its flags and time to live. conflict reports that the
// item changed or went away since it was read, notStored that memcached
// refused the value, cas the CAS value of the item stored. It is never
// sent twice: when a reply is lost the write may have happened.
func (s *Server) StoreIfUnchanged(key string, it MetaItem, value []byte) (conflict, notStored bool, cas uint64, err error) {
	return s.raw.storeIfUnchanged(key, it, value)
}

// DropIdle closes the server's idle connections after one of them turned
// out broken: when a server restarts, every pooled connection is dead, and
// without this each would fail one request before it is noticed.
func (s *Server) DropIdle(err error) {
	if !isConnError(err) {
		return
	}
	s.raw.dropIdle()
}

// Close stops the server's prober and closes its idle connections. It is
// called once no request uses the server any more: at the end of Shutdown,
// or one DNS interval after discovery removed the server. A request that
// ends after that closes its own connection (see rawPool.run), and one that
// ended before pooled it for the close below.
func (s *Server) Close() {
	s.health.close()
	s.raw.close()
}

// Ejected reports whether the server is ejected: requests to it fail at
// once until a probe finds it back.
func (s *Server) Ejected() bool { return s.health.down.Load() }

// Failing reports whether the server failed since its last answer,
// ejected or not.
func (s *Server) Failing() bool { return s.health.failing.Load() }

// Ejections returns how many times the server was ejected.
func (s *Server) Ejections() uint64 { return s.health.ejections.Load() }

// Closed reports whether Close was called.
func (s *Server) Closed() bool {
	s.raw.mu.Lock()
	defer s.raw.mu.Unlock()
	return s.raw.closed
}

// Requests returns how many requests the server was sent.
func (s *Server) Requests() uint64 { return s.up.requests.Load() }

// Errors returns how many requests to the server failed with kind k.
func (s *Server) Errors(k Kind) uint64 { return s.up.errors[k].Load() }
