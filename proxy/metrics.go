package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
)

// collector exports the proxy's counters to Prometheus. It reads the same
// atomics the "stats" command reads, at scrape time, so the request path
// pays nothing for metrics. Every command and outcome pair is exported,
// zero or not.
type collector struct {
	p           *Proxy
	requests    *prometheus.Desc
	connections *prometheus.Desc
	accepted    *prometheus.Desc
	connRefused *prometheus.Desc
	idleClosed  *prometheus.Desc
	bytesIn     *prometheus.Desc
	bytesOut    *prometheus.Desc
	keys        *prometheus.Desc
	upErrors    *prometheus.Desc
	upServers   *prometheus.Desc
	upGets      *prometheus.Desc
	upGetKeys   *prometheus.Desc
	refused     *prometheus.Desc
	deleted     *prometheus.Desc
	logical     *prometheus.Desc
	stored      *prometheus.Desc
	rewrites    *prometheus.Desc
	rejected    *prometheus.Desc
	unbound     *prometheus.Desc
}

// Register adds the proxy's metrics to reg.
func (p *Proxy) Register(reg prometheus.Registerer) error {
	const ns = "mcsidecar"
	return reg.Register(&collector{
		p:           p,
		requests:    prometheus.NewDesc(ns+"_requests_total", "Client requests by command and outcome.", []string{"command", "outcome"}, nil),
		connections: prometheus.NewDesc(ns+"_client_connections", "Client connections open now.", nil, nil),
		accepted:    prometheus.NewDesc(ns+"_client_connections_accepted_total", "Client connections accepted.", nil, nil),
		connRefused: prometheus.NewDesc(ns+"_client_connections_refused_total", "Client connections refused over --max-connections.", nil, nil),
		idleClosed:  prometheus.NewDesc(ns+"_client_connections_idle_closed_total", "Client connections closed after --idle-timeout without a complete request.", nil, nil),
		bytesIn:     prometheus.NewDesc(ns+"_client_read_bytes_total", "Bytes read from clients.", nil, nil),
		bytesOut:    prometheus.NewDesc(ns+"_client_written_bytes_total", "Bytes written to clients.", nil, nil),
		keys:        prometheus.NewDesc(ns+"_retrieved_keys_total", "Keys asked for by retrieval commands, by result.", []string{"result"}, nil),
		upErrors:    prometheus.NewDesc(ns+"_upstream_errors_total", "Upstream requests that failed (timeouts, refused connections, bad replies).", nil, nil),
		upServers:   prometheus.NewDesc(ns+"_upstream_servers", "Upstream memcached servers configured.", nil, nil),
		upGets:      prometheus.NewDesc(ns+"_upstream_gets_total", "Get requests sent upstream; concurrent client gets are coalesced into one.", nil, nil),
		upGetKeys:   prometheus.NewDesc(ns+"_upstream_get_keys_total", "Keys in the get requests sent upstream.", nil, nil),
		refused:     prometheus.NewDesc(ns+"_codec_refused_total", "Enveloped items read from upstream and served as a miss, by reason.", []string{"reason"}, nil),
		deleted:     prometheus.NewDesc(ns+"_codec_deleted_total", "Damaged enveloped items deleted upstream (--codec-delete-corrupt).", nil, nil),
		logical:     prometheus.NewDesc(ns+"_codec_written_logical_bytes_total", "Bytes of enveloped values written, as the clients sent them.", nil, nil),
		stored:      prometheus.NewDesc(ns+"_codec_written_stored_bytes_total", "Bytes of enveloped values written, as stored upstream (envelope included).", nil, nil),
		rewrites:    prometheus.NewDesc(ns+"_key_rewrites_total", "Client keys rewritten for upstream, by scheme and by the step the rewrite ended at.", []string{"scheme", "step"}, nil),
		rejected:    prometheus.NewDesc(ns+"_key_rejected_total", "Client keys refused with CLIENT_ERROR, by reason.", []string{"reason"}, nil),
		unbound:     prometheus.NewDesc(ns+"_key_unbound_items_total", "Items read under a rewritten key that were not an envelope (another client's value at an equal key), served as a miss.", nil, nil),
	})
}

func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.requests, m.connections, m.accepted, m.connRefused, m.idleClosed, m.bytesIn, m.bytesOut, m.keys, m.upErrors, m.upServers, m.upGets, m.upGetKeys, m.refused, m.deleted, m.logical, m.stored, m.rewrites, m.rejected, m.unbound} {
		ch <- d
	}
	describeHealth(ch)
}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	s := m.p.stats
	m.p.collectHealth(ch)
	for id := range numCommands {
		for oc := range numOutcomes {
			ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue,
				float64(s.requests[id][oc].Load()), commands[id].name, outcomeNames[oc])
		}
	}
	ch <- prometheus.MustNewConstMetric(m.connections, prometheus.GaugeValue, float64(s.currConns.Load()))
	ch <- prometheus.MustNewConstMetric(m.accepted, prometheus.CounterValue, float64(s.totalConns.Load()))
	ch <- prometheus.MustNewConstMetric(m.connRefused, prometheus.CounterValue, float64(s.connsRefused.Load()))
	ch <- prometheus.MustNewConstMetric(m.idleClosed, prometheus.CounterValue, float64(s.connsIdleClosed.Load()))
	ch <- prometheus.MustNewConstMetric(m.bytesIn, prometheus.CounterValue, float64(s.bytesRead.Load()))
	ch <- prometheus.MustNewConstMetric(m.bytesOut, prometheus.CounterValue, float64(s.bytesWritten.Load()))
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.CounterValue, float64(s.getHits.Load()+s.touchHits.Load()), "hit")
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.CounterValue, float64(s.getMisses.Load()+s.touchMisses.Load()), "miss")
	ch <- prometheus.MustNewConstMetric(m.upErrors, prometheus.CounterValue, float64(s.upstreamErrors.Load()))
	ch <- prometheus.MustNewConstMetric(m.upServers, prometheus.GaugeValue, float64(len(m.p.upstreams().servers)))
	ch <- prometheus.MustNewConstMetric(m.upGets, prometheus.CounterValue, float64(s.upstreamGets.Load()))
	ch <- prometheus.MustNewConstMetric(m.upGetKeys, prometheus.CounterValue, float64(s.upstreamGetKeys.Load()))
	for _, r := range codec.Reasons() {
		ch <- prometheus.MustNewConstMetric(m.refused, prometheus.CounterValue, float64(s.codecRefused[r&15].Load()), r.String())
	}
	ch <- prometheus.MustNewConstMetric(m.deleted, prometheus.CounterValue, float64(s.codecDeleted.Load()))
	ch <- prometheus.MustNewConstMetric(m.logical, prometheus.CounterValue, float64(s.codecLogical.Load()))
	ch <- prometheus.MustNewConstMetric(m.stored, prometheus.CounterValue, float64(s.codecStored.Load()))
	if ks := m.p.keys; ks != nil {
		for i, scheme := range ks.SchemeNames() {
			for _, step := range keyspace.Steps() {
				ch <- prometheus.MustNewConstMetric(m.rewrites, prometheus.CounterValue,
					float64(s.keyRewrites[i*numSteps+int(step)].Load()), scheme, step.String())
			}
		}
		for _, r := range keyspace.Reasons() {
			ch <- prometheus.MustNewConstMetric(m.rejected, prometheus.CounterValue, float64(s.keyRejected[r&7].Load()), r.String())
		}
		ch <- prometheus.MustNewConstMetric(m.unbound, prometheus.CounterValue, float64(s.keyUnbound.Load()))
	}
}
