package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// collector exports the proxy's counters to Prometheus. It reads the same
// atomics the "stats" command reads, at scrape time, so the request path
// pays nothing for metrics but the latency observations. Every label
// combination is exported, zero or not, and every label value comes from a
// fixed list: the command table, the outcomes, the configured servers,
// the error kinds, the schemes and reasons, and at most --metrics-tenants
// tenants plus "other".
type collector struct {
	p           *Proxy
	requests    *prometheus.Desc
	connections *prometheus.Desc
	accepted    *prometheus.Desc
	refusedConn *prometheus.Desc
	idleClosed  *prometheus.Desc
	outClosed   *prometheus.Desc
	readPauses  *prometheus.Desc
	clientMoves *prometheus.Desc
	bytesIn     *prometheus.Desc
	bytesOut    *prometheus.Desc
	keys        *prometheus.Desc
	upRequests  *prometheus.Desc
	upErrors    *prometheus.Desc
	upOutOfStep *prometheus.Desc
	upServers   *prometheus.Desc
	upGets      *prometheus.Desc
	upGetKeys   *prometheus.Desc
	refused     *prometheus.Desc
	deleted     *prometheus.Desc
	logical     *prometheus.Desc
	stored      *prometheus.Desc
	readLogical *prometheus.Desc
	readStored  *prometheus.Desc
	rewrites    *prometheus.Desc
	rejected    *prometheus.Desc
	unbound     *prometheus.Desc
	zoneReads   *prometheus.Desc
	zoneBytes   *prometheus.Desc
	zoneFills   *prometheus.Desc
	zoneWrites  *prometheus.Desc
	tierReads   *prometheus.Desc
	tierEvicted *prometheus.Desc
	tierMutable *prometheus.Desc
	tierBytes   *prometheus.Desc
	tierEntries *prometheus.Desc
	tierLimit   *prometheus.Desc
	tenants     stats.TenantDescs
}

// Register adds the proxy's metrics to reg.
func (p *Proxy) Register(reg prometheus.Registerer) error {
	const ns = "mcsidecar"
	return reg.Register(&collector{
		p:           p,
		requests:    prometheus.NewDesc(ns+"_requests_total", "Client requests by command and outcome.", []string{"command", "outcome"}, nil),
		connections: prometheus.NewDesc(ns+"_client_connections", "Client connections open now.", nil, nil),
		accepted:    prometheus.NewDesc(ns+"_client_connections_accepted_total", "Client connections accepted.", nil, nil),
		refusedConn: prometheus.NewDesc(ns+"_client_connections_refused_total", "Client connections closed at accept because the proxy was at --max-connections.", nil, nil),
		idleClosed:  prometheus.NewDesc(ns+"_client_connections_idle_closed_total", "Client connections closed after --idle-timeout without a complete request.", nil, nil),
		outClosed:   prometheus.NewDesc(ns+"_client_output_limit_closed_total", "Client connections closed after --idle-timeout with replies they had not read waiting in the proxy: held by an event loop (at --max-client-output-bytes, or for a socket that took no more). Counted in the idle closes too.", nil, nil),
		clientMoves: prometheus.NewDesc(ns+"_client_loop_moves_total", "Client connections moved to another event loop, between two requests, because they read long replies and that loop had fewer such clients.", nil, nil),
		readPauses:  prometheus.NewDesc(ns+"_client_read_pauses_total", "Times an event loop stopped reading a client's socket because the client had sent more requests than the loop lets wait (4 MiB) while replies were owed; reading resumes once half of them are answered.", nil, nil),
		bytesIn:     prometheus.NewDesc(ns+"_client_read_bytes_total", "Bytes read from clients.", nil, nil),
		bytesOut:    prometheus.NewDesc(ns+"_client_written_bytes_total", "Bytes written to clients.", nil, nil),
		keys:        prometheus.NewDesc(ns+"_retrieved_keys_total", "Keys asked for by retrieval commands, by result.", []string{"result"}, nil),
		upRequests:  prometheus.NewDesc(ns+"_upstream_requests_total", "Requests sent to upstream servers, by server; a batch of requests of many clients, written together, counts once.", []string{"server"}, nil),
		upErrors:    prometheus.NewDesc(ns+"_upstream_errors_total", "Upstream requests that failed, by server and kind: connect, timeout, connection (broken), server_error, protocol, ejected (not sent: the server is ejected).", []string{"server", "kind"}, nil),
		upOutOfStep: prometheus.NewDesc(ns+"_upstream_protocol_errors_total", "Upstream connections closed because a reply did not answer the request in its place, by server and reason: out_of_memory (memcached's out-of-memory error, after which it may drop replies owed), unexpected_reply, unasked_key, malformed. Every request pending on such a connection failed; no client read a byte after the mismatch.", []string{"server", "reason"}, nil),
		upServers:   prometheus.NewDesc(ns+"_upstream_servers", "Upstream memcached servers in the current set (after DNS discovery).", nil, nil),
		upGets:      prometheus.NewDesc(ns+"_upstream_gets_total", "Get requests sent upstream; neighbouring client gets on one upstream connection are joined into one.", nil, nil),
		upGetKeys:   prometheus.NewDesc(ns+"_upstream_get_keys_total", "Keys in the get requests sent upstream.", nil, nil),
		refused:     prometheus.NewDesc(ns+"_codec_verification_failures_total", "Enveloped items read from upstream that failed verification and were served as a miss, by reason.", []string{"reason"}, nil),
		deleted:     prometheus.NewDesc(ns+"_codec_deleted_total", "Damaged enveloped items deleted upstream (--codec-delete-corrupt).", nil, nil),
		logical:     prometheus.NewDesc(ns+"_codec_written_logical_bytes_total", "Bytes of enveloped values written, as the clients sent them. The saving is 1 - stored/logical.", nil, nil),
		stored:      prometheus.NewDesc(ns+"_codec_written_stored_bytes_total", "Bytes of enveloped values written, as memcached holds them (envelope included).", nil, nil),
		readLogical: prometheus.NewDesc(ns+"_codec_read_logical_bytes_total", "Bytes of enveloped values served to clients after verification, as the clients see them.", nil, nil),
		readStored:  prometheus.NewDesc(ns+"_codec_read_stored_bytes_total", "Bytes of the same values as read from memcached (envelope included).", nil, nil),
		rewrites:    prometheus.NewDesc(ns+"_key_rewrites_total", "Client keys rewritten for upstream, by scheme and by the step the rewrite ended at.", []string{"scheme", "step"}, nil),
		rejected:    prometheus.NewDesc(ns+"_key_rejected_total", "Client keys refused with CLIENT_ERROR, by reason.", []string{"reason"}, nil),
		unbound:     prometheus.NewDesc(ns+"_key_unbound_items_total", "Items read under a rewritten key that were not an envelope (another client's value at an equal key), served as a miss.", nil, nil),
		zoneReads:   prometheus.NewDesc(ns+"_zone_reads_total", "Keys of retrievals asked of each zone, by result: hit, miss or error (its server failed or is ejected). A key asked of the local zone (local=\"true\") that it does not answer is asked of the next zone.", []string{"zone", "local", "result"}, nil),
		zoneBytes:   prometheus.NewDesc(ns+"_zone_read_bytes_total", "Bytes of the values of hits read from each zone, as memcached holds them; the share from zones with local=\"false\" crossed a zone boundary.", []string{"zone", "local"}, nil),
		zoneFills:   prometheus.NewDesc(ns+"_zone_fills_total", "Hits from another zone stored into the local zone (--zone-fill), by result: stored, not_stored (the local zone already had the key), failed, or dropped (a write to the key through the sidecar raced it: not sent, or deleted again).", []string{"result"}, nil),
		zoneWrites:  prometheus.NewDesc(ns+"_zone_write_failures_total", "Writes (storage commands, delete, touch, flush_all, and the sets and deletes that bring other zones in line) that failed in a zone, by zone.", []string{"zone"}, nil),
		tierReads:   prometheus.NewDesc(ns+"_local_cache_reads_total", "Keys of get requests whose value never changes, looked up in the local tier, by result: hit (answered by the sidecar, no upstream request) or miss.", []string{"result"}, nil),
		tierEvicted: prometheus.NewDesc(ns+"_local_cache_evictions_total", "Entries the local tier dropped to stay within --local-cache-size.", nil, nil),
		tierMutable: prometheus.NewDesc(ns+"_local_cache_refused_mutable_total", "Hits read from memcached that the local tier did not keep because their key scheme does not say the value never changes.", nil, nil),
		tierBytes:   prometheus.NewDesc(ns+"_local_cache_bytes", "Bytes the local tier holds: values, keys and bookkeeping.", nil, nil),
		tierEntries: prometheus.NewDesc(ns+"_local_cache_entries", "Entries in the local tier.", nil, nil),
		tierLimit:   prometheus.NewDesc(ns+"_local_cache_limit_bytes", "The local tier's size, --local-cache-size.", nil, nil),
		tenants:     stats.NewTenantDescs(ns),
	})
}

func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.requests, m.connections, m.accepted, m.refusedConn, m.idleClosed, m.outClosed, m.readPauses, m.clientMoves, m.bytesIn, m.bytesOut, m.keys,
		m.upRequests, m.upErrors, m.upOutOfStep, m.upServers, m.upGets, m.upGetKeys, m.refused, m.deleted, m.logical, m.stored,
		m.readLogical, m.readStored, m.rewrites, m.rejected, m.unbound, m.zoneReads, m.zoneBytes, m.zoneFills, m.zoneWrites,
		m.tierReads, m.tierEvicted, m.tierMutable, m.tierBytes, m.tierEntries, m.tierLimit} {
		ch <- d
	}
	upstream.DescribeHealth(ch)
	m.tenants.Describe(ch)
	m.p.stats.RequestLatency.Describe(ch)
	m.p.stats.UpstreamLatency.Describe(ch)
}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	s := m.p.stats
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	servers := m.p.uniqueServers()
	upstream.CollectHealth(ch, servers)
	for id := range wire.NumCommands {
		for oc := range stats.NumOutcomes {
			counter(m.requests, s.Requests[id][oc].Load(), wire.Commands[id].Name, stats.OutcomeNames[oc])
		}
	}
	ch <- prometheus.MustNewConstMetric(m.connections, prometheus.GaugeValue, float64(s.CurrConns.Load()))
	counter(m.accepted, uint64(s.TotalConns.Load()))
	counter(m.refusedConn, s.ConnsRefused.Load())
	counter(m.idleClosed, s.ConnsIdleClosed.Load())
	counter(m.outClosed, s.ConnsOutputClosed.Load())
	counter(m.readPauses, s.ClientReadPauses.Load())
	counter(m.clientMoves, s.ClientMoves.Load())
	counter(m.bytesIn, s.BytesRead.Load())
	counter(m.bytesOut, s.BytesWritten.Load())
	counter(m.keys, s.GetHits.Load()+s.TouchHits.Load(), "hit")
	counter(m.keys, s.GetMisses.Load()+s.TouchMisses.Load(), "miss")
	for _, srv := range servers {
		counter(m.upRequests, srv.Requests(), srv.Name())
		for k := upstream.KindNone + 1; k < upstream.NumKinds; k++ {
			counter(m.upErrors, srv.Errors(k), srv.Name(), k.String())
		}
		for r := range upstream.NumReasons {
			counter(m.upOutOfStep, srv.ProtocolErrors(r), srv.Name(), r.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(m.upServers, prometheus.GaugeValue, float64(len(servers)))
	counter(m.upGets, s.UpstreamGets.Load())
	counter(m.upGetKeys, s.UpstreamGetKeys.Load())
	for _, r := range codec.Reasons() {
		counter(m.refused, s.CodecRefused[r&15].Load(), r.String())
	}
	counter(m.deleted, s.CodecDeleted.Load())
	counter(m.logical, s.CodecLogical.Load())
	counter(m.stored, s.CodecStored.Load())
	counter(m.readLogical, s.CodecReadLogical.Load())
	counter(m.readStored, s.CodecReadStored.Load())
	if ks := m.p.keys; ks != nil {
		for i, scheme := range ks.SchemeNames() {
			for _, step := range keyspace.Steps() {
				counter(m.rewrites, s.KeyRewrites[i*numSteps+int(step)].Load(), scheme, step.String())
			}
		}
		for _, r := range keyspace.Reasons() {
			counter(m.rejected, s.KeyRejected[r&7].Load(), r.String())
		}
		counter(m.unbound, s.KeyUnbound.Load())
	}
	if m.p.zoned() {
		for i, z := range m.p.zones {
			local := "false"
			if i == 0 {
				local = "true"
			}
			for r := range zones.NumResults {
				counter(m.zoneReads, z.Reads[r].Load(), z.Name, local, zones.ResultNames[r])
			}
			counter(m.zoneBytes, z.ReadBytes.Load(), z.Name, local)
			counter(m.zoneWrites, z.WriteFailures.Load(), z.Name)
		}
		for r := range zones.NumFillResults {
			counter(m.zoneFills, m.p.fills[r].Load(), zones.FillResultNames[r])
		}
	}
	if t := m.p.tier; t != nil {
		ts := t.Stats()
		counter(m.tierReads, ts.Hits, "hit")
		counter(m.tierReads, ts.Misses, "miss")
		counter(m.tierEvicted, ts.Evictions)
		counter(m.tierMutable, s.TierMutable.Load())
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
		}
		gauge(m.tierBytes, float64(ts.Bytes))
		gauge(m.tierEntries, float64(ts.Entries))
		gauge(m.tierLimit, float64(m.p.cfg.LocalCacheSize))
	}
	m.tenants.Collect(ch, m.p.tenants)
	s.RequestLatency.Collect(ch)
	s.UpstreamLatency.Collect(ch)
}
