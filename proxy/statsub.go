package proxy

import (
	"cmp"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/zones"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// statLines appends "STAT <name> <value>\r\n" lines to a reply.
type statLines []byte

func (b *statLines) str(name, v string) {
	*b = append(*b, wire.LineStat...)
	*b = append(*b, name...)
	*b = append(*b, ' ')
	*b = append(*b, v...)
	*b = append(*b, wire.CRLF...)
}

func (b *statLines) num(name string, v int64) { b.str(name, strconv.FormatInt(v, 10)) }

func (b *statLines) flag(name string, on bool) {
	if on {
		b.str(name, "yes")
	} else {
		b.str(name, "no")
	}
}

// appendSettings answers "stats settings": memcached's own names for the
// settings that mean something for a proxy, with the sidecar's values,
// then the sidecar's own settings under their flag names (dashes as
// underscores). memcached's memory settings (slabs, LRU, hash table) have
// no counterpart: the sidecar holds no items but its local tier's.
func (p *Proxy) appendSettings(dst []byte) []byte {
	b := statLines(dst)
	cfg := &p.cfg
	host, port, unix := "NULL", "0", "NULL"
	listen := cfg.Listen
	p.mu.Lock()
	if len(p.listeners) > 0 {
		listen = p.listeners[0].Addr().String() // the port chosen for :0
		if p.listeners[0].Addr().Network() == "unix" {
			listen = "unix:" + listen
		}
	}
	p.mu.Unlock()
	if path, ok := cutUnix(listen); ok {
		unix = path
	} else if h, pt, err := net.SplitHostPort(listen); err == nil {
		host, port = h, pt
		if host == "" {
			host = "NULL"
		}
	}
	b.num("maxbytes", int64(cfg.LocalCacheSize))
	b.num("maxconns", int64(cfg.MaxConnections))
	b.str("tcpport", port)
	b.num("udpport", 0)
	b.str("inter", host)
	b.num("verbosity", 0)
	b.str("evictions", "on")
	b.str("domain_socket", unix)
	b.num("num_threads", int64(runtimeThreads()))
	b.flag("cas_enabled", true)
	b.str("binding_protocol", "ascii")
	b.num("item_size_max", int64(cfg.MaxItemSize))
	b.flag("flush_enabled", true)
	b.num("idle_timeout", int64(cfg.IdleTimeout/time.Second))
	b.flag("ssl_enabled", p.tls != nil)

	// The sidecar's own.
	b.str("upstream", strings.Join(cfg.Upstreams, ","))
	b.str("upstream_selector", cfg.Selector)
	b.num("upstream_timeout_ms", cfg.Timeout.Milliseconds())
	b.num("upstream_connect_timeout_ms", cfg.ConnectTimeout.Milliseconds())
	b.num("upstream_max_idle_conns", int64(cfg.MaxIdleConns))
	b.num("upstream_get_batch_keys", int64(cfg.GetBatchKeys))
	b.str("upstream_retrieval_failure", cfg.RetrievalFailure)
	b.num("upstream_failure_limit", int64(cfg.FailureLimit))
	b.num("upstream_retry_interval_ms", cfg.RetryInterval.Milliseconds())
	b.flag("upstream_eject_rehash", cfg.EjectRehash)
	b.num("upstream_dns_interval_s", int64(cfg.DNSInterval/time.Second))
	b.flag("upstream_tls_enabled", cfg.UpstreamTLS.Enabled)
	if p.zoned() {
		b.str("zone", p.zones[0].Name)
		b.str("upstream_zone", strings.Join(cfg.ZoneUpstreams, " "))
		writes := cfg.ZoneWrites
		if writes == "" {
			writes = zones.WritesAll
		}
		b.str("zone_writes", writes)
		b.flag("zone_fill", cfg.ZoneFill)
	}
	b.num("local_cache_size", int64(cfg.LocalCacheSize))
	b.num("max_value_size", int64(cfg.maxValueSize()))
	b.num("max_request_line", int64(cfg.MaxRequestLine))
	b.num("metrics_tenants", int64(cfg.MetricsTenants))
	if ks := p.keys; ks != nil {
		b.num("key_max_length", int64(ks.MaxLength()))
		b.num("key_max_client_length", int64(ks.MaxClientLength()))
	}
	if cd := cfg.Codec; cd != nil {
		b.num("codec_flag_bit", int64(cd.FlagBit))
		b.str("codec_prefixes", strings.Join(cd.Prefixes, ","))
		b.num("codec_min_size", int64(cd.MinSize))
		b.str("codec_min_savings", strconv.FormatFloat(cd.MinSavings, 'f', -1, 64))
		b.flag("codec_delete_corrupt", cd.DeleteCorrupt)
	}
	return append(b, wire.LineEnd...)
}

// appendConns answers "stats conns" as memcached does, one group of lines
// per client connection, numbered in the order they were accepted:
// "<n>:addr", "<n>:listen_addr", "<n>:state" (conn_parse_cmd for the
// connection asking, whose request is being handled, conn_waiting for the
// others, whose state belongs to their loops) and
// "<n>:secs_since_last_cmd".
func (p *Proxy) appendConns(dst []byte, asking *conn) []byte {
	b := statLines(dst)
	now := time.Now().UnixNano()
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	sortConns(conns)
	for _, c := range conns {
		n := strconv.FormatUint(c.id, 10) + ":"
		nc := c.sock()
		b.str(n+"addr", connAddr(nc.RemoteAddr()))
		b.str(n+"listen_addr", connAddr(nc.LocalAddr()))
		state := "conn_waiting"
		if c == asking {
			state = "conn_parse_cmd"
		}
		b.str(n+"state", state)
		last := c.lastCmd.Load()
		if last == 0 {
			last = c.accepted
		}
		b.num(n+"secs_since_last_cmd", (now-last)/int64(time.Second))
	}
	return append(b, wire.LineEnd...)
}

// connAddr writes an address as memcached does: tcp:host:port or
// unix:path.
func connAddr(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	if a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return "tcp:" + a.String()
}

func runtimeThreads() int { return runtime.GOMAXPROCS(0) }

func sortConns(conns []*conn) {
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(a.id, b.id) })
}
