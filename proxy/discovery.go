package proxy

import (
	"context"
	"net"
	"slices"
	"time"

	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// Resolver looks up the addresses behind dns+, dnssrv+ and dnssrvnoa+
// upstream entries. *net.Resolver is one; tests use a fake that answers
// with the loopback addresses of memcached servers they started.
type Resolver = upstream.Resolver

// discovers reports whether any upstream entry is looked up in DNS.
func (c *Config) discovers() bool {
	specs, _ := c.zoneSpecs()
	for _, z := range specs {
		for _, s := range z.Entries {
			if e, err := upstream.ParseEntry(s); err == nil && !e.Static() {
				return true
			}
		}
	}
	return false
}

// upstreams returns the current server set of the local zone.
func (p *Proxy) upstreams() *upstream.Set { return p.zones[0].Up.Load() }

// newUpstreams builds the set of servers named, keeping those of old that
// are still named, with their pools and health. It returns the servers of
// old that are not, for the caller to close.
func (p *Proxy) newUpstreams(names []string, old *upstream.Set) (*upstream.Set, []*upstream.Server, error) {
	o := &upstream.Options{
		Timeout:        p.cfg.Timeout,
		ConnectTimeout: p.cfg.ConnectTimeout,
		MaxIdleConns:   p.cfg.MaxIdleConns,
		FailureLimit:   p.cfg.FailureLimit,
		RetryInterval:  p.cfg.RetryInterval,
		TLS:            p.cfg.UpstreamTLS.config,
		Log:            p.log,
		Totals: upstream.Totals{
			Errors:  &p.stats.UpstreamErrors,
			Gets:    &p.stats.UpstreamGets,
			GetKeys: &p.stats.UpstreamGetKeys,
			Latency: p.stats.UpstreamLatency,
		},
	}
	return upstream.NewSet(p.cfg.Selector, names, old, o)
}

// discovery is the goroutine that looks the DNS entries up again every
// --upstream-dns-interval.
type discovery struct {
	stop context.CancelFunc
	done chan struct{}
}

// startDiscovery starts the lookups when an entry needs them.
func (p *Proxy) startDiscovery() {
	if !p.cfg.discovers() {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &discovery{stop: stop, done: make(chan struct{})}
	p.discovery = d
	go func() {
		defer close(d.done)
		p.discover(ctx)
	}()
}

// stopDiscovery stops the lookups and waits until they have stopped.
func (p *Proxy) stopDiscovery() {
	if d := p.discovery; d != nil {
		d.stop()
		<-d.done
	}
}

// discover looks the entries of every zone up every interval and swaps in
// a zone's new set when it differs. A lookup that fails or finds nothing
// keeps the zone's last set; that is logged once when it starts and once
// when it ends. Client connections are not touched: each takes the new
// set at its next command.
//
// A removed server is closed at the next tick, not at once: requests that
// took the old set may still be using it, and an interval is long enough
// for them to end (each is bounded by the upstream timeout).
func (p *Proxy) discover(ctx context.Context) {
	t := time.NewTicker(p.cfg.DNSInterval)
	defer t.Stop()
	var retired []*upstream.Server
	defer func() { p.retire(retired) }()
	failing := make([]bool, len(p.zones))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.retire(retired)
		retired = nil
		for i, z := range p.zones {
			removed, ok := p.rediscover(ctx, z, failing[i])
			if ctx.Err() != nil {
				return
			}
			failing[i] = !ok
			retired = append(retired, removed...)
		}
	}
}

// rediscover looks zone z's entries up once and swaps in its new set when
// it differs. It returns the servers removed, and whether the lookup
// worked; failing says it did not last time.
func (p *Proxy) rediscover(ctx context.Context, z *zones.Zone, failing bool) ([]*upstream.Server, bool) {
	lctx, cancel := context.WithTimeout(ctx, min(p.cfg.DNSInterval, upstream.LookupTimeout))
	names, err := upstream.Resolve(lctx, p.resolver(), z.Entries)
	cancel()
	if ctx.Err() != nil {
		return nil, false
	}
	old := z.Up.Load()
	var u *upstream.Set
	var removed []*upstream.Server
	if err == nil && !slices.Equal(upstream.OrderServers(names), old.Names) {
		// A server named by a host its client cannot resolve fails
		// here, like a failed lookup.
		u, removed, err = p.newUpstreams(names, old)
	}
	log := p.log
	if z.Name != "" {
		log = log.With("zone", z.Name)
	}
	if err != nil {
		if !failing {
			log.Warn("upstream lookup failed; keeping the last servers", "err", err, "servers", old.Names)
		}
		return nil, false
	}
	if failing {
		log.Info("upstream lookup works again")
	}
	if u != nil {
		z.Up.Store(u)
		log.Info("upstream servers changed", "servers", u.Names, "removed", len(removed))
	}
	return removed, true
}

// retire closes servers that discovery removed, and drops the request
// time series of each that no zone's current set names: the other
// per-server families export only the current sets, and with DNS names
// that change as pods move, series of servers long gone would pile up. A
// server named again later starts a new series.
func (p *Proxy) retire(servers []*upstream.Server) {
	if len(servers) == 0 {
		return
	}
	current := p.allServers()
	for _, s := range servers {
		// No request uses s any more: its series goes first, so that a
		// closed server has none.
		if !slices.ContainsFunc(current, func(c *upstream.Server) bool { return c.Name() == s.Name() }) {
			p.stats.UpstreamLatency.DeleteLabelValues(s.Name())
		}
		s.Close()
	}
}

// resolver returns the configured resolver, or the system's.
func (p *Proxy) resolver() Resolver {
	if p.cfg.Resolver != nil {
		return p.cfg.Resolver
	}
	return net.DefaultResolver
}
