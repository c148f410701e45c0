package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/internal/writeguard"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/tier"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// errTooManyFiles is the accept error worth waiting out: the process ran
// out of file descriptors, and closing connections will free some.
var errTooManyFiles error = syscall.EMFILE

// Proxy serves the memcached protocol in front of a set of upstream servers.
type Proxy struct {
	cfg     Config
	version string
	log     *slog.Logger
	// zones holds the server sets, the local zone's first: one without
	// zones. Discovery swaps a zone's set when DNS changes.
	zones     []*zones.Zone
	fills     [zones.NumFillResults]atomic.Uint64
	discovery *discovery // nil: every upstream entry is static
	stats     *stats.Counters
	tenants   *stats.Tenants     // nil: no per-tenant view
	codec     *codec.Codec       // nil: no value is enveloped
	tier      *tier.Cache        // nil: no local tier
	guard     *writeguard.Guard  // nil: nothing stores what reads fetched (see guards)
	keys      *keyspace.Keyspace // nil: keys are not rewritten
	// keyLine is the longest a line that names a key may run without a
	// newline (see wire.KeyedLineMax).
	keyLine int
	// schemeIndex numbers keys.SchemeNames() for the rewrite counters.
	schemeIndex map[string]int
	tls         *tls.Config // nil: clients speak plain TCP

	connIDs   atomic.Uint64 // numbers client connections for "stats conns"
	drain     atomic.Bool
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[*conn]struct{}
	wg        sync.WaitGroup
	loops     *eventLoops // made by the first Serve
	// firstLoop: every client begins on the first loop (--event-loops
	// -1, see loopmove.go), not on the one with the fewest.
	firstLoop bool
}

// New validates cfg and builds a proxy over its upstream servers. No
// connection is made until a client asks for something.
func New(cfg Config, version string, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	firstLoop := false
	switch {
	case cfg.EventLoops == EventLoopsAuto:
		cfg.EventLoops, firstLoop = autoLoops(), true
	case cfg.EventLoops <= 0:
		cfg.EventLoops = 1
	}
	var err error
	var cd *codec.Codec
	if cfg.Codec != nil {
		own := *cfg.Codec // the caller's may change; the proxy's must not
		own.MaxValueSize = cfg.maxValueSize()
		cfg.Codec = &own
		if cd, err = codec.New(own); err != nil {
			return nil, err
		}
	}
	var ks *keyspace.Keyspace
	if cfg.Keys != nil {
		own := *cfg.Keys
		cfg.Keys = &own
		if ks, err = keyspace.New(own); err != nil {
			return nil, err
		}
	}
	tlsCfg, err := cfg.TLS.config()
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		firstLoop: firstLoop,
		tls:       tlsCfg,
		keys:      ks,
		codec:     cd,
		cfg:       cfg,
		version:   version,
		log:       log,
		stats:     stats.New(),
		conns:     make(map[*conn]struct{}),
	}
	p.stats.Log = log
	p.keyLine = wire.LineLimit
	if ks != nil {
		p.keyLine = wire.KeyedLineMax(ks.MaxClientLength())
	}
	if cfg.LocalCacheSize > 0 {
		p.tier = tier.New(int64(cfg.LocalCacheSize))
		p.stats.Tier = p.tier
	}
	if ks != nil {
		p.schemeIndex = make(map[string]int)
		for i, name := range ks.SchemeNames() {
			p.schemeIndex[name] = i
		}
		p.stats.KeyRewrites = make([]atomic.Uint64, len(p.schemeIndex)*numSteps)
		if cfg.MetricsTenants > 0 {
			p.tenants = stats.NewTenants(cfg.MetricsTenants)
		}
	}
	specs, err := cfg.zoneSpecs()
	if err != nil {
		return nil, err
	}
	for _, spec := range specs {
		// The first lookup must succeed: there is no last good set to
		// keep.
		ctx, cancel := context.WithTimeout(context.Background(), upstream.LookupTimeout)
		names, err := upstream.Resolve(ctx, p.resolver(), spec.Entries)
		cancel()
		var up *upstream.Set
		if err == nil {
			up, _, err = p.newUpstreams(names, nil)
		}
		if err != nil {
			p.closeServers()
			if spec.Name != "" {
				err = fmt.Errorf("zone %s: %w", spec.Name, err)
			}
			return nil, err
		}
		z := &zones.Zone{Spec: spec}
		z.Up.Store(up)
		p.zones = append(p.zones, z)
	}
	if p.guards() {
		p.guard = new(writeguard.Guard)
	}
	p.startDiscovery()
	return p, nil
}

// Listen opens the address of --listen: host:port or unix:/path.
func Listen(addr string) (net.Listener, error) {
	if path, ok := cutUnix(addr); ok {
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

func cutUnix(addr string) (string, bool) {
	if len(addr) > 5 && addr[:5] == "unix:" {
		return addr[5:], true
	}
	return "", false
}

// Serve accepts clients on ln until Shutdown. It returns nil after a
// shutdown and the accept error otherwise.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.drain.Load() {
		p.mu.Unlock()
		ln.Close()
		return nil
	}
	p.listeners = append(p.listeners, ln)
	if p.loops == nil {
		loops, err := newEventLoops(p)
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.loops = loops
	}
	p.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if p.drain.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log.Warn("accept failed", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		backoff = 0
		if p.overLimit() {
			p.refuse(nc)
			continue
		}
		raw := nc
		var t *loopTLS
		if p.tls != nil {
			t = &loopTLS{b: &tlsBridge{Conn: nc}}
			t.conn = tls.Server(t.b, p.tls)
			nc = t.conn
		}
		c := newConn(p, nc)
		if !p.track(c) {
			nc.Close()
			continue
		}
		if t != nil {
			go p.loops.enrollTLS(c, raw, t)
			continue
		}
		if err := p.loops.enroll(c); err != nil {
			p.log.Warn("event loop refused a connection", "err", err)
			nc.Close()
			p.untrack(c)
		}
	}
}

func (p *Proxy) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drain.Load() {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.stats.CurrConns.Add(1)
	p.stats.TotalConns.Add(1)
	return true
}

func (p *Proxy) untrack(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.stats.CurrConns.Add(-1)
	p.wg.Done()
}

// draining reports whether Shutdown has begun.
func (p *Proxy) draining() bool { return p.drain.Load() }

// Shutdown stops accepting, lets every connection finish the requests it
// has read, closes idle connections, and then closes the upstream clients.
// When ctx ends first, the remaining connections are closed at once.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.drain.Store(true)
	for _, ln := range p.listeners {
		ln.Close()
	}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
		case <-ctx.Done():
			// Like net/http, give up on connections still busy: close them
			// and return; their goroutines end within the upstream timeout,
			// and the last one out closes the upstream pools.
			p.mu.Lock()
			loops := p.loops
			if loops != nil {
				// Before the sockets close: a connection moving off a
				// loop meanwhile sees it (see closed).
				loops.abandon.Store(true)
			}
			for c := range p.conns {
				c.closeNow()
			}
			p.mu.Unlock()
			go func() {
				if loops != nil {
					loops.close() // closes the connections still on a loop
				}
				<-done
				p.closeServers()
			}()
			return ctx.Err()
		}
	}
	p.mu.Lock()
	loops := p.loops
	p.mu.Unlock()
	if loops != nil {
		loops.close()
	}
	p.closeServers()
	return nil
}

func (p *Proxy) closeServers() {
	p.stopDiscovery()
	for _, s := range p.allServers() {
		s.Close()
	}
}

// Ready reports whether at least one upstream server, of any zone,
// answers. The servers are asked at once; the first answer decides. An
// ejected server is not asked: it counts as not answering.
func (p *Proxy) Ready(ctx context.Context) error {
	servers := p.allServers()
	results := make(chan error, len(servers))
	for _, s := range servers {
		go func() { results <- s.Ping() }()
	}
	var last error
	for range servers {
		select {
		case err := <-results:
			if err == nil {
				return nil
			}
			last = err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("no upstream server answers: %w", last)
}

// ServerSelector places keys on memcached servers exactly as the proxy
// does, for a gomemcache client (memcache.NewFromSelector); see
// upstream.ServerSelector.
type ServerSelector = upstream.ServerSelector

// NewServerSelector returns the selector named by scheme (jump or ketama)
// over servers, each host:port or unix:/path as in --upstream.
func NewServerSelector(scheme string, servers []string) (*ServerSelector, error) {
	return upstream.NewServerSelector(scheme, servers)
}

// overLimit reports whether --max-connections client connections are open
// already. The count is the one "stats" reports as curr_connections.
func (p *Proxy) overLimit() bool {
	limit := p.cfg.MaxConnections
	return limit > 0 && p.stats.CurrConns.Load() >= int64(limit)
}

// refuse turns away a connection over the limit the way memcached does when
// it is at -c: one error line, in plain text even on a TLS listener, and
// close. It runs on the accept loop, so the write may not block: a new
// socket's send buffer is empty, and the deadline guards the rest.
func (p *Proxy) refuse(nc net.Conn) {
	p.stats.ConnsRefused.Add(1)
	nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	nc.Write(wire.LineTooManyConns)
	nc.Close()
}
