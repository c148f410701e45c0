package proxy

import (
	"context"
	"log/slog"
	"net"

	"github.com/bradfitz/gomemcache/memcache"
)

// cache is the part of gomemcache's client the proxy uses on one server. It
// is the seam where forwarding is tested with exact bytes in and out.
type cache interface {
	Set(item *memcache.Item) error
	Add(item *memcache.Item) error
	Replace(item *memcache.Item) error
	Append(item *memcache.Item) error
	Prepend(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
	Delete(key string) error
	Touch(key string, seconds int32) error
	Increment(key string, delta uint64) (uint64, error)
	Decrement(key string, delta uint64) (uint64, error)
}

// server is one upstream memcached: a gomemcache client of its own (so each
// server has its own connection pool), the coalescer that batches its gets,
// the few operations gomemcache lacks, and its health, which every request
// through client and raw passes.
type server struct {
	name   string
	client cache
	gets   *coalescer
	raw    *rawPool
	health *health
	up     *serverStats
}

func newServer(name string, cfg *Config, st *stats, log *slog.Logger) (*server, error) {
	network, addr, err := splitUpstream(name)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, addr)
	}
	tlsCfg, err := cfg.UpstreamTLS.config()
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr) // empty for a unix socket
	dial = withTLS(dial, tlsCfg, host, cfg.ConnectTimeout)
	var list memcache.ServerList
	// gomemcache takes a path with a slash as a unix socket.
	if err := list.SetServers(addr); err != nil {
		return nil, err
	}
	mc := memcache.NewFromSelector(&list)
	mc.DialContext = dial
	mc.Timeout = cfg.Timeout
	mc.MaxIdleConns = cfg.MaxIdleConns
	up := newServerStats(name, st)
	raw := &rawPool{dial: dial, timeout: cfg.Timeout, connectTimeout: cfg.ConnectTimeout, maxIdle: cfg.MaxIdleConns}
	h := newHealth(name, cfg, log, raw.probe)
	raw.health = h
	s := &server{
		name:   name,
		client: guarded{next: mc, h: h, st: up},
		raw:    raw,
		health: h,
		up:     up,
	}
	s.gets = newCoalescer(s.raw, up, cfg.GetConcurrency, cfg.GetBatchKeys)
	return s, nil
}

// dropIdle closes the server's idle connections after one of them turned
// out broken: when a server restarts, every pooled connection is dead, and
// without this each would fail one request before it is noticed.
func (s *server) dropIdle(err error) {
	if !isConnError(err) {
		return
	}
	s.raw.dropIdle()
	if c, ok := s.client.(interface{ Close() error }); ok {
		c.Close() // gomemcache: closes idle connections; the client stays usable
	}
}

// close stops the server's prober and closes its idle connections. It is
// called once no request uses the server any more: at the end of Shutdown,
// or one DNS interval after discovery removed the server. The health is
// closed first: a request that ends after that closes its own connection
// (see guarded.call), and one that ended before pooled it for the Close
// below.
func (s *server) close() {
	s.health.close()
	s.raw.close()
	if c, ok := s.client.(interface{ Close() error }); ok {
		c.Close()
	}
}
