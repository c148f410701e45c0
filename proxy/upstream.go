package proxy

import (
	"context"
	"log/slog"
	"net"
)

// server is one upstream memcached: its connection pool, the coalescer
// that pipelines every client's requests to it in batches, and its health,
// which every request passes.
type server struct {
	name   string
	pipe   *coalescer // every request but flush_all and the envelope's
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
	up := newServerStats(name, st)
	raw := &rawPool{dial: dial, timeout: cfg.Timeout, connectTimeout: cfg.ConnectTimeout, maxIdle: cfg.MaxIdleConns}
	h := newHealth(name, cfg, log, raw.probe)
	raw.health = h
	s := &server{
		name:   name,
		raw:    raw,
		health: h,
		up:     up,
	}
	s.pipe = newCoalescer(s.raw, up, cfg.GetConcurrency, cfg.GetBatchKeys)
	// The local tier keeps a value only as long as memcached would: its
	// gets ask for the time to live too.
	s.pipe.r.meta = cfg.LocalCacheSize > 0
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
}

// close stops the server's prober and closes its idle connections. It is
// called once no request uses the server any more: at the end of Shutdown,
// or one DNS interval after discovery removed the server. A request that
// ends after that closes its own connection (see rawPool.run), and one that
// ended before pooled it for the close below.
func (s *server) close() {
	s.health.close()
	s.raw.close()
}
