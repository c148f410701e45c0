package proxy

import (
	"context"
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
// and the few operations gomemcache lacks.
type server struct {
	name   string
	client cache
	gets   *coalescer
	raw    *rawPool
	up     *serverStats
}

func newServer(name string, cfg *Config, st *stats) (*server, error) {
	network, addr, err := splitUpstream(name)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, addr)
	}
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
	s := &server{
		name:   name,
		client: observedCache{next: mc, st: up},
		raw:    &rawPool{dial: dial, timeout: cfg.Timeout, connectTimeout: cfg.ConnectTimeout, maxIdle: cfg.MaxIdleConns},
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

func (s *server) close() {
	s.raw.close()
	if c, ok := s.client.(interface{ Close() error }); ok {
		c.Close()
	}
}
