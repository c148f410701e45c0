package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	jump "github.com/dgryski/go-jump"
)

// Resolver looks up the addresses behind dns+, dnssrv+ and dnssrvnoa+
// upstream entries. *net.Resolver is one; tests use a fake that answers
// with the loopback addresses of memcached servers they started.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
}

// Kinds of --upstream entry, with grafana/dskit's meaning of each prefix.
type entryKind uint8

const (
	entryStatic entryKind = iota // host:port or unix:/path, used as it is
	entryDNS                     // dns+host:port: every A/AAAA record of host
	entrySRV                     // dnssrv+name: the addresses of every SRV target
	entrySRVNoA                  // dnssrvnoa+name: every SRV target as named
)

// entry is one parsed --upstream entry. For the DNS kinds, name is what is
// looked up; port is the entry's own, which for SRV overrides the record's.
type entry struct {
	kind       entryKind
	name, port string
}

// lookupTimeout bounds one lookup of every DNS entry.
const lookupTimeout = 10 * time.Second

var errNoRecords = errors.New("no records")

func parseEntry(s string) (entry, error) {
	if rest, ok := strings.CutPrefix(s, "dns+"); ok {
		host, port, err := splitHostPort(rest)
		if err != nil || host == "" {
			return entry{}, fmt.Errorf("--upstream %q: want dns+host:port", s)
		}
		// An IPv6 literal is written in brackets, and looked up without.
		return entry{kind: entryDNS, name: strings.Trim(host, "[]"), port: port}, nil
	}
	kind := entrySRV
	rest, ok := strings.CutPrefix(s, "dnssrv+")
	if !ok {
		kind = entrySRVNoA
		rest, ok = strings.CutPrefix(s, "dnssrvnoa+")
	}
	if ok {
		e := entry{kind: kind, name: rest}
		if host, port, err := splitHostPort(rest); err == nil {
			e.name, e.port = host, port
		}
		if e.name == "" {
			return entry{}, fmt.Errorf("--upstream %q: want %s_service._proto.name", s, s[:len(s)-len(rest)])
		}
		return e, nil
	}
	if _, _, err := splitUpstream(s); err != nil {
		return entry{}, err
	}
	return entry{kind: entryStatic, name: s}, nil
}

// discovers reports whether any upstream entry is looked up in DNS.
func (c *Config) discovers() bool {
	zones, _ := c.zoneSpecs()
	for _, z := range zones {
		for _, s := range z.entries {
			if e, err := parseEntry(s); err == nil && e.kind != entryStatic {
				return true
			}
		}
	}
	return false
}

// resolve turns the --upstream entries into server names, each named once.
// Any lookup that fails or finds nothing fails the whole: a partial set
// would move the keys of the servers it misses.
func resolve(ctx context.Context, r Resolver, entries []string) ([]string, error) {
	var names []string
	add := func(name string) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	hosts := func(host, port string) error {
		addrs, err := r.LookupHost(ctx, host)
		if err == nil && len(addrs) == 0 {
			err = errNoRecords
		}
		if err != nil {
			return fmt.Errorf("lookup %s: %w", host, err)
		}
		for _, a := range addrs {
			add(net.JoinHostPort(a, port))
		}
		return nil
	}
	for _, s := range entries {
		e, err := parseEntry(s)
		if err != nil {
			return nil, err
		}
		switch e.kind {
		case entryStatic:
			add(s)
		case entryDNS:
			if err := hosts(e.name, e.port); err != nil {
				return nil, err
			}
		case entrySRV, entrySRVNoA:
			_, recs, err := r.LookupSRV(ctx, "", "", e.name)
			if err == nil && len(recs) == 0 {
				err = errNoRecords
			}
			if err != nil {
				return nil, fmt.Errorf("lookup SRV %s: %w", e.name, err)
			}
			for _, rec := range recs {
				port := e.port
				if port == "" {
					port = strconv.Itoa(int(rec.Port))
				}
				if e.kind == entrySRVNoA {
					add(net.JoinHostPort(strings.TrimSuffix(rec.Target, "."), port))
				} else if err := hosts(rec.Target, port); err != nil {
					return nil, err
				}
			}
		}
	}
	return names, nil
}

// upstreams is one set of servers and the selector over them. It never
// changes: discovery builds a new one and swaps it in whole, so a request
// takes the current set with one atomic load and uses it throughout,
// without a lock.
type upstreams struct {
	names   []string // in selector order
	servers []*server
	sel     selector
}

// upstreams returns the current server set of the local zone.
func (p *Proxy) upstreams() *upstreams { return p.zones[0].up.Load() }

// newUpstreams builds the set of servers named, keeping those of old that
// are still named, with their pools and health. It returns the servers of
// old that are not, for the caller to close.
func (p *Proxy) newUpstreams(names []string, old *upstreams) (*upstreams, []*server, error) {
	names = orderServers(names)
	sel, err := newSelector(p.cfg.Selector, names)
	if err != nil {
		return nil, nil, err
	}
	kept := map[string]*server{}
	if old != nil {
		for _, s := range old.servers {
			kept[s.name] = s
		}
	}
	u := &upstreams{names: names, sel: sel}
	var created []*server
	for _, name := range names {
		s, ok := kept[name]
		if ok {
			delete(kept, name)
		} else if s, err = newServer(name, &p.cfg, p.stats, p.log); err != nil {
			for _, s := range created {
				s.close()
			}
			return nil, nil, err
		} else {
			created = append(created, s)
		}
		u.servers = append(u.servers, s)
	}
	var removed []*server
	for _, s := range kept {
		removed = append(removed, s)
	}
	return u, removed, nil
}

// pick returns the index of the server that owns key. With rehash, a key
// whose server is ejected goes to one that is not.
func (u *upstreams) pick(key string, rehash bool) int {
	i := u.sel.pick(key)
	if rehash && u.servers[i].health.down.Load() {
		return u.rehash(key, i)
	}
	return i
}

// rehash picks a server that is up for a key whose own server is ejected.
// Candidates are drawn by jump hash of the key under successive seeds, so
// the keys of an ejected server spread over all the others instead of
// piling onto one, and a key keeps its stand-in while the ejected servers
// stay the same. Keys of servers that are up never move.
func (u *upstreams) rehash(key string, own int) int {
	n := len(u.servers)
	h := xxhash.Sum64String(key)
	for seed := range uint64(4 * n) {
		j := int(jump.Hash(h+(seed+1)*0x9e3779b97f4a7c15, n))
		if !u.servers[j].health.down.Load() {
			return j
		}
	}
	// Most servers are out: take the first one up, if any is.
	for j, s := range u.servers {
		if !s.health.down.Load() {
			return j
		}
	}
	return own
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
	var retired []*server
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
func (p *Proxy) rediscover(ctx context.Context, z *zone, failing bool) ([]*server, bool) {
	lctx, cancel := context.WithTimeout(ctx, min(p.cfg.DNSInterval, lookupTimeout))
	names, err := resolve(lctx, p.resolver(), z.entries)
	cancel()
	if ctx.Err() != nil {
		return nil, false
	}
	old := z.up.Load()
	var u *upstreams
	var removed []*server
	if err == nil && !slices.Equal(orderServers(names), old.names) {
		// A server named by a host its client cannot resolve fails
		// here, like a failed lookup.
		u, removed, err = p.newUpstreams(names, old)
	}
	log := p.log
	if z.name != "" {
		log = log.With("zone", z.name)
	}
	if err != nil {
		if !failing {
			log.Warn("upstream lookup failed; keeping the last servers", "err", err, "servers", old.names)
		}
		return nil, false
	}
	if failing {
		log.Info("upstream lookup works again")
	}
	if u != nil {
		z.up.Store(u)
		log.Info("upstream servers changed", "servers", u.names, "removed", len(removed))
	}
	return removed, true
}

// retire closes servers that discovery removed, and drops the request
// time series of each that no zone's current set names: the other
// per-server families export only the current sets, and with DNS names
// that change as pods move, series of servers long gone would pile up. A
// server named again later starts a new series.
func (p *Proxy) retire(servers []*server) {
	if len(servers) == 0 {
		return
	}
	current := p.allServers()
	for _, s := range servers {
		s.close()
		if !slices.ContainsFunc(current, func(c *server) bool { return c.name == s.name }) {
			p.stats.upstreamLatency.DeleteLabelValues(s.name)
		}
	}
}

// resolver returns the configured resolver, or the system's.
func (p *Proxy) resolver() Resolver {
	if p.cfg.Resolver != nil {
		return p.cfg.Resolver
	}
	return net.DefaultResolver
}

// useUpstreams takes the current server sets for the command about to run,
// and sizes the connection's per-server calls to them.
func (c *conn) useUpstreams() {
	up := c.p.upstreams()
	if up != c.up {
		c.up = up
		c.calls = sizeCalls(c.calls, len(up.servers))
	}
	if len(c.p.zones) == 1 {
		return
	}
	if c.zs == nil {
		c.zs = make([]zoneCalls, len(c.p.zones))
		for i := range c.zs {
			c.zs[i].cmd = newGetCall()
		}
	}
	c.zs[0].up, c.zs[0].calls, c.zs[0].cmd = c.up, c.calls, c.cmd
	for i, z := range c.p.zones[1:] {
		zc := &c.zs[i+1]
		if up := z.up.Load(); up != zc.up {
			zc.up = up
			zc.calls = sizeCalls(zc.calls, len(up.servers))
		}
	}
}

// sizeCalls returns calls with one call per server of n.
func sizeCalls(calls []*getCall, n int) []*getCall {
	for len(calls) < n {
		calls = append(calls, newGetCall())
	}
	return calls[:n]
}
