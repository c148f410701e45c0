package proxy

import (
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/tier"
)

// stats holds the counters the memcached "stats" command reports, kept with
// atomics so that connections never contend on a lock. The Prometheus
// metrics read the same counters.
type stats struct {
	started time.Time
	log     *slog.Logger

	currConns, totalConns    atomic.Int64
	connsRefused             atomic.Uint64 // turned away at accept (--max-connections)
	bytesRead, bytesWritten  atomic.Uint64
	cmdGet, cmdSet, cmdTouch atomic.Uint64
	getHits, getMisses       atomic.Uint64
	touchHits, touchMisses   atomic.Uint64
	upstreamErrors           atomic.Uint64
	upstreamGets             atomic.Uint64 // get requests sent upstream
	upstreamGetKeys          atomic.Uint64 // keys in them
	upstreamReadsInPlace     atomic.Uint64 // reads of a long reply's rest straight into its buffer (loop)
	clientReadsInPlace       atomic.Uint64 // reads of a long set's rest straight into its buffer (loop)
	connsIdleClosed          atomic.Uint64 // closed by --idle-timeout
	connsOutputClosed        atomic.Uint64 // of those, closed with replies left unread (see output.go)
	clientReadPauses         atomic.Uint64 // an event loop stopped reading a client (see loopUnreadMax)
	requests                 [wire.NumCommands][numOutcomes]atomic.Uint64

	// Values, when the codec is on: envelopes refused on read by reason
	// (indexed by codec.Reason), damaged items deleted upstream, and the
	// bytes of enveloped writes as clients sent them and as stored.
	codecRefused              [16]atomic.Uint64
	codecDeleted              atomic.Uint64
	codecLogical, codecStored atomic.Uint64
	// The same for enveloped values read and served.
	codecReadLogical, codecReadStored atomic.Uint64

	// Keys, when key settings are on: rewrites by scheme (as numbered in
	// Proxy.schemeIndex) and step, at scheme*numSteps+step; keys refused
	// by keyspace.Reason; and items read under a rewritten key that were
	// not an envelope bound to a key (a plain value at a colliding key).
	keyRewrites []atomic.Uint64
	keyRejected [8]atomic.Uint64
	keyUnbound  atomic.Uint64

	// The local tier's own counters, and hits memcached answered that it
	// did not keep because their key's value may change.
	tier        *tier.Cache // nil: no local tier
	tierMutable atomic.Uint64

	// Latency of client requests by command (from the command line read
	// to the reply buffered) and of upstream requests by server. The
	// observers are resolved once, so an observation is a few atomic adds.
	requestLatency  *prometheus.HistogramVec
	latency         [wire.NumCommands]prometheus.Observer
	upstreamLatency *prometheus.HistogramVec

	baseMu sync.Mutex
	base   counters // at the last "stats reset"
}

// latencyBuckets spans a loopback memcached round trip (about 50µs) to a
// request that met the longest sensible upstream timeout.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

func newStats() *stats {
	s := &stats{
		started: time.Now(),
		log:     slog.New(slog.DiscardHandler),
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcsidecar_request_duration_seconds",
			Help:    "Time to answer a client request, from its command line read to its reply written, by command.",
			Buckets: latencyBuckets,
		}, []string{"command"}),
		upstreamLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcsidecar_upstream_request_duration_seconds",
			Help:    "Time of requests to upstream memcached servers, by server (failed requests included).",
			Buckets: latencyBuckets,
		}, []string{"server"}),
	}
	for id := range wire.NumCommands {
		s.latency[id] = s.requestLatency.WithLabelValues(wire.Commands[id].Name)
	}
	return s
}

// record counts one request of command id with its outcome.
func (s *stats) record(id int, oc outcome) { s.requests[id][oc].Add(1) }

// keyTally counts the keys of one retrieval, hit or miss, as memcached
// counts get_hits, for the proxy and for each key's tenant. It adds them to
// the shared counters once, in flush: a 100-key get costs a few atomic adds
// rather than two to four per key, on counters every thread writes.
type keyTally struct {
	touch        bool // the keys of gat or gats: touch_hits, not get_hits
	hits, misses uint64
	// The tenant of the keys counted since the last tenant change, and its
	// counts: a retrieval's keys are usually one tenant's.
	tenant           *tenantCounters
	tenantN, tenantH uint64
}

// add counts a key of tenant t (nil: none).
func (k *keyTally) add(t *tenantCounters, hit bool) {
	if hit {
		k.hits++
	} else {
		k.misses++
	}
	if t == nil {
		return
	}
	if t != k.tenant {
		k.flushTenant()
		k.tenant = t
	}
	k.tenantN++
	if hit {
		k.tenantH++
	}
}

// flushTenant adds the current tenant's counts to its counters.
func (k *keyTally) flushTenant() {
	if k.tenant != nil { // set by add, which counted a key of it
		k.tenant.requests.Add(k.tenantN)
		if k.tenantH > 0 {
			k.tenant.hits.Add(k.tenantH)
		}
	}
	k.tenant, k.tenantN, k.tenantH = nil, 0, 0
}

// flush adds what k counted to s and the tenants' counters, and empties k.
func (k *keyTally) flush(s *stats) {
	k.flushTenant()
	cmd, hits, misses := &s.cmdGet, &s.getHits, &s.getMisses
	if k.touch {
		cmd, hits, misses = &s.cmdTouch, &s.touchHits, &s.touchMisses
	}
	if n := k.hits + k.misses; n > 0 {
		cmd.Add(n)
	}
	if k.hits > 0 {
		hits.Add(k.hits)
	}
	if k.misses > 0 {
		misses.Add(k.misses)
	}
	k.hits, k.misses = 0, 0
}

// counters is a moment's copy of the counters "stats reset" zeroes.
type counters struct {
	totalConns, bytesRead, bytesWritten      uint64
	cmdGet, cmdSet, cmdTouch                 uint64
	getHits, getMisses, touchHits, touchMiss uint64
	upstreamErrors, upstreamGets, upGetKeys  uint64
	connsRefused, connsIdleClosed            uint64
	codecDeleted, codecLogical, codecStored  uint64
	keyRewrites, keyUnbound                  uint64
	tierHits, tierMisses, tierEvictions      uint64
	tierMutable                              uint64
	codecRefused                             [16]uint64
	keyRejected                              [8]uint64
	requests                                 [wire.NumCommands][numOutcomes]uint64
}

func (s *stats) snapshot() counters {
	c := counters{
		totalConns: uint64(s.totalConns.Load()), bytesRead: s.bytesRead.Load(), bytesWritten: s.bytesWritten.Load(),
		cmdGet: s.cmdGet.Load(), cmdSet: s.cmdSet.Load(), cmdTouch: s.cmdTouch.Load(),
		getHits: s.getHits.Load(), getMisses: s.getMisses.Load(), touchHits: s.touchHits.Load(), touchMiss: s.touchMisses.Load(),
		upstreamErrors: s.upstreamErrors.Load(), upstreamGets: s.upstreamGets.Load(), upGetKeys: s.upstreamGetKeys.Load(),
		connsRefused: s.connsRefused.Load(), connsIdleClosed: s.connsIdleClosed.Load(),
		codecDeleted: s.codecDeleted.Load(), codecLogical: s.codecLogical.Load(), codecStored: s.codecStored.Load(),
		keyUnbound: s.keyUnbound.Load(), tierMutable: s.tierMutable.Load(),
	}
	if s.tier != nil {
		ts := s.tier.Stats()
		c.tierHits, c.tierMisses, c.tierEvictions = ts.Hits, ts.Misses, ts.Evictions
	}
	for i := range s.keyRewrites {
		c.keyRewrites += s.keyRewrites[i].Load()
	}
	for i := range c.codecRefused {
		c.codecRefused[i] = s.codecRefused[i].Load()
	}
	for i := range c.keyRejected {
		c.keyRejected[i] = s.keyRejected[i].Load()
	}
	for id := range c.requests {
		for oc := range c.requests[id] {
			c.requests[id][oc] = s.requests[id][oc].Load()
		}
	}
	return c
}

// sub returns c less an earlier copy b.
func (c counters) sub(b counters) counters {
	out := counters{
		totalConns: c.totalConns - b.totalConns, bytesRead: c.bytesRead - b.bytesRead, bytesWritten: c.bytesWritten - b.bytesWritten,
		cmdGet: c.cmdGet - b.cmdGet, cmdSet: c.cmdSet - b.cmdSet, cmdTouch: c.cmdTouch - b.cmdTouch,
		getHits: c.getHits - b.getHits, getMisses: c.getMisses - b.getMisses, touchHits: c.touchHits - b.touchHits, touchMiss: c.touchMiss - b.touchMiss,
		upstreamErrors: c.upstreamErrors - b.upstreamErrors, upstreamGets: c.upstreamGets - b.upstreamGets, upGetKeys: c.upGetKeys - b.upGetKeys,
		connsRefused: c.connsRefused - b.connsRefused, connsIdleClosed: c.connsIdleClosed - b.connsIdleClosed,
		codecDeleted: c.codecDeleted - b.codecDeleted, codecLogical: c.codecLogical - b.codecLogical, codecStored: c.codecStored - b.codecStored,
		keyRewrites: c.keyRewrites - b.keyRewrites, keyUnbound: c.keyUnbound - b.keyUnbound,
		tierHits: c.tierHits - b.tierHits, tierMisses: c.tierMisses - b.tierMisses,
		tierEvictions: c.tierEvictions - b.tierEvictions, tierMutable: c.tierMutable - b.tierMutable,
	}
	for i := range out.codecRefused {
		out.codecRefused[i] = c.codecRefused[i] - b.codecRefused[i]
	}
	for i := range out.keyRejected {
		out.keyRejected[i] = c.keyRejected[i] - b.keyRejected[i]
	}
	for id := range out.requests {
		for oc := range out.requests[id] {
			out.requests[id][oc] = c.requests[id][oc] - b.requests[id][oc]
		}
	}
	return out
}

// reset makes "stats" count from now on, as memcached's "stats reset"
// does. The counters themselves never go back: Prometheus reads them, and
// a counter that falls is a restart to it.
func (s *stats) reset() {
	snap := s.snapshot()
	s.baseMu.Lock()
	s.base = snap
	s.baseMu.Unlock()
}

// sinceReset returns the counters as "stats" reports them.
func (s *stats) sinceReset() counters {
	s.baseMu.Lock()
	base := s.base
	s.baseMu.Unlock()
	return s.snapshot().sub(base)
}

// appendStats writes the "stats" reply in memcached's format.
func (s *stats) appendStats(b []byte, p *Proxy) []byte {
	now := time.Now()
	c := s.sinceReset()
	count := func(id int, oc outcome) uint64 { return c.requests[id][oc] }
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	num := func(name string, v uint64) {
		b = append(b, wire.LineStat...)
		b = append(b, name...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, v, 10)
		b = append(b, wire.CRLF...)
	}
	str := func(name, v string) {
		b = append(b, wire.LineStat...)
		b = append(b, name...)
		b = append(b, ' ')
		b = append(b, v...)
		b = append(b, wire.CRLF...)
	}
	rusage := func(tv syscall.Timeval) string {
		return strconv.FormatInt(tv.Sec, 10) + "." + leftPad(strconv.FormatInt(int64(tv.Usec), 10), 6)
	}
	num("pid", uint64(os.Getpid()))
	num("uptime", uint64(now.Sub(s.started)/time.Second))
	num("time", uint64(now.Unix()))
	str("version", p.version)
	num("pointer_size", strconv.IntSize)
	str("rusage_user", rusage(ru.Utime))
	str("rusage_system", rusage(ru.Stime))
	num("curr_connections", uint64(s.currConns.Load()))
	num("total_connections", c.totalConns)
	// memcached's names for the same two counters.
	num("rejected_connections", c.connsRefused)
	num("idle_kicks", c.connsIdleClosed)
	num("cmd_get", c.cmdGet)
	num("cmd_set", c.cmdSet)
	num("cmd_flush", count(wire.CmdFlushAll, outcomeOK))
	num("cmd_touch", c.cmdTouch+count(wire.CmdTouch, outcomeOK)+count(wire.CmdTouch, outcomeNotFound))
	num("get_hits", c.getHits)
	num("get_misses", c.getMisses)
	num("delete_misses", count(wire.CmdDelete, outcomeNotFound))
	num("delete_hits", count(wire.CmdDelete, outcomeOK))
	num("incr_misses", count(wire.CmdIncr, outcomeNotFound))
	num("incr_hits", count(wire.CmdIncr, outcomeOK))
	num("decr_misses", count(wire.CmdDecr, outcomeNotFound))
	num("decr_hits", count(wire.CmdDecr, outcomeOK))
	num("cas_misses", count(wire.CmdCas, outcomeNotFound))
	num("cas_hits", count(wire.CmdCas, outcomeStored))
	num("cas_badval", count(wire.CmdCas, outcomeExists))
	num("touch_hits", c.touchHits+count(wire.CmdTouch, outcomeOK))
	num("touch_misses", c.touchMiss+count(wire.CmdTouch, outcomeNotFound))
	num("bytes_read", c.bytesRead)
	num("bytes_written", c.bytesWritten)
	num("threads", uint64(runtime.GOMAXPROCS(0)))
	num("upstream_servers", uint64(len(p.uniqueServers())))
	num("upstream_errors", c.upstreamErrors)
	num("upstream_gets", c.upstreamGets)
	num("upstream_get_keys", c.upGetKeys)
	// The proxy's own counters, named as the Prometheus metrics are
	// (less the prefix), so both views read alike.
	if p.codec != nil {
		for _, r := range codec.Reasons() {
			num("codec_verification_failures_"+r.String(), c.codecRefused[r&15])
		}
		num("codec_deleted", c.codecDeleted)
		num("codec_written_logical_bytes", c.codecLogical)
		num("codec_written_stored_bytes", c.codecStored)
	}
	if p.keys != nil {
		num("key_rewrites", c.keyRewrites)
		for _, r := range keyspace.Reasons() {
			num("key_rejected_"+r.String(), c.keyRejected[r&7])
		}
		num("key_unbound_items", c.keyUnbound)
	}
	if p.tier != nil {
		ts := p.tier.Stats()
		num("local_cache_hits", c.tierHits)
		num("local_cache_misses", c.tierMisses)
		num("local_cache_evictions", c.tierEvictions)
		num("local_cache_refused_mutable", c.tierMutable)
		num("local_cache_bytes", uint64(ts.Bytes))
		num("local_cache_entries", uint64(ts.Entries))
		num("local_cache_limit_bytes", uint64(p.cfg.LocalCacheSize))
	}
	return append(b, wire.LineEnd...)
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}
