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
	// TLS returns the TLS configuration of a new server's connections;
	// nil, or a nil configuration, is plain TCP.
	TLS    func() (*tls.Config, error)
	Log    *slog.Logger
	Totals Totals
}

// Server is one upstream memcached: its name, its health, which every
// request passes, its counters, how to dial it for an event loop
// (DialLoop), and a small pool of connections for readiness pings and
// health probes.
type Server struct {
	name   string
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
	return s, nil
}

// Name returns the server as --upstream or DNS named it.
func (s *Server) Name() string { return s.name }

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

// Ping asks the server for its version, the cheapest request it answers.
// An ejected server is not asked: it does not answer.
func (s *Server) Ping() error { return s.raw.ping() }

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
