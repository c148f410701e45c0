// Package stats keeps what the sidecar counts: the counters memcached's
// "stats" command reports (and the Prometheus metrics read), requests by
// command and outcome, latency histograms, and the per-tenant counters of
// the busiest tenants. Counting is a few atomic adds; nothing here locks
// on the request path.
package stats

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

// Counters holds the counters the memcached "stats" command reports, kept with
// atomics so that connections never contend on a lock. The Prometheus
// metrics read the same counters.
type Counters struct {
	started time.Time
	Log     *slog.Logger

	CurrConns, TotalConns    atomic.Int64
	ConnsRefused             atomic.Uint64 // turned away at accept (--max-connections)
	BytesRead, BytesWritten  atomic.Uint64
	CmdGet, CmdSet, CmdTouch atomic.Uint64
	GetHits, GetMisses       atomic.Uint64
	TouchHits, TouchMisses   atomic.Uint64
	UpstreamErrors           atomic.Uint64
	UpstreamGets             atomic.Uint64 // get requests sent upstream
	UpstreamGetKeys          atomic.Uint64 // keys in them
	UpstreamReadsInPlace     atomic.Uint64 // reads of a long reply's rest straight into its buffer (loop)
	ClientReadsInPlace       atomic.Uint64 // reads of a long set's rest straight into its buffer (loop)
	ConnsIdleClosed          atomic.Uint64 // closed by --idle-timeout
	ConnsOutputClosed        atomic.Uint64 // of those, closed with replies left unread (see proxy/output.go)
	ClientReadPauses         atomic.Uint64 // an event loop stopped reading a client (see proxy.loopUnreadMax)
	ClientMoves              atomic.Uint64 // clients moved to another event loop (see proxy/loopmove.go)
	Requests                 [wire.NumCommands][NumOutcomes]atomic.Uint64

	// Values, when the codec is on: envelopes refused on read by reason
	// (indexed by codec.Reason), damaged items deleted upstream, and the
	// bytes of enveloped writes as clients sent them and as stored.
	CodecRefused              [16]atomic.Uint64
	CodecDeleted              atomic.Uint64
	CodecLogical, CodecStored atomic.Uint64
	// The same for enveloped values read and served.
	CodecReadLogical, CodecReadStored atomic.Uint64

	// Keys, when key settings are on: rewrites by scheme (as numbered in
	// the proxy's schemeIndex) and step, at scheme*numSteps+step; keys refused
	// by keyspace.Reason; and items read under a rewritten key that were
	// not an envelope bound to a key (a plain value at a colliding key).
	KeyRewrites []atomic.Uint64
	KeyRejected [8]atomic.Uint64
	KeyUnbound  atomic.Uint64

	// The local tier's own counters, and hits memcached answered that it
	// did not keep because their key's value may change.
	Tier        *tier.Cache // nil: no local tier
	TierMutable atomic.Uint64

	// Latency of client requests by command (from the command line read
	// to the reply buffered) and of upstream requests by server. The
	// observers are resolved once, so an observation is a few atomic adds.
	RequestLatency  *prometheus.HistogramVec
	Latency         [wire.NumCommands]prometheus.Observer
	UpstreamLatency *prometheus.HistogramVec

	baseMu sync.Mutex
	base   counters // at the last "stats reset"
}

// latencyBuckets spans a loopback memcached round trip (about 50µs) to a
// request that met the longest sensible upstream timeout.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

func New() *Counters {
	s := &Counters{
		started: time.Now(),
		Log:     slog.New(slog.DiscardHandler),
		RequestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcsidecar_request_duration_seconds",
			Help:    "Time to answer a client request, from its command line read to its reply written, by command.",
			Buckets: latencyBuckets,
		}, []string{"command"}),
		UpstreamLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcsidecar_upstream_request_duration_seconds",
			Help:    "Time of requests to upstream memcached servers, by server (failed requests included).",
			Buckets: latencyBuckets,
		}, []string{"server"}),
	}
	for id := range wire.NumCommands {
		s.Latency[id] = s.RequestLatency.WithLabelValues(wire.Commands[id].Name)
	}
	return s
}

// Record counts one request of command id with its outcome.
func (s *Counters) Record(id int, oc Outcome) { s.Requests[id][oc].Add(1) }

// Tally counts the keys of one retrieval, hit or miss, as memcached
// counts get_hits, for the proxy and for each key's tenant. It adds them to
// the shared counters once, in flush: a 100-key get costs a few atomic adds
// rather than two to four per key, on counters every thread writes.
type Tally struct {
	Touch        bool // the keys of gat or gats: touch_hits, not get_hits
	hits, misses uint64
	// The tenant of the keys counted since the last tenant change, and its
	// counts: a retrieval's keys are usually one tenant's.
	tenant           *TenantCounters
	tenantN, tenantH uint64
}

// Add counts a key of tenant t (nil: none).
func (k *Tally) Add(t *TenantCounters, hit bool) {
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
func (k *Tally) flushTenant() {
	if k.tenant != nil { // set by add, which counted a key of it
		k.tenant.Requests.Add(k.tenantN)
		if k.tenantH > 0 {
			k.tenant.Hits.Add(k.tenantH)
		}
	}
	k.tenant, k.tenantN, k.tenantH = nil, 0, 0
}

// Flush adds what k counted to s and the tenants' counters, and empties k.
func (k *Tally) Flush(s *Counters) {
	k.flushTenant()
	cmd, hits, misses := &s.CmdGet, &s.GetHits, &s.GetMisses
	if k.Touch {
		cmd, hits, misses = &s.CmdTouch, &s.TouchHits, &s.TouchMisses
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
	requests                                 [wire.NumCommands][NumOutcomes]uint64
}

func (s *Counters) snapshot() counters {
	c := counters{
		totalConns: uint64(s.TotalConns.Load()), bytesRead: s.BytesRead.Load(), bytesWritten: s.BytesWritten.Load(),
		cmdGet: s.CmdGet.Load(), cmdSet: s.CmdSet.Load(), cmdTouch: s.CmdTouch.Load(),
		getHits: s.GetHits.Load(), getMisses: s.GetMisses.Load(), touchHits: s.TouchHits.Load(), touchMiss: s.TouchMisses.Load(),
		upstreamErrors: s.UpstreamErrors.Load(), upstreamGets: s.UpstreamGets.Load(), upGetKeys: s.UpstreamGetKeys.Load(),
		connsRefused: s.ConnsRefused.Load(), connsIdleClosed: s.ConnsIdleClosed.Load(),
		codecDeleted: s.CodecDeleted.Load(), codecLogical: s.CodecLogical.Load(), codecStored: s.CodecStored.Load(),
		keyUnbound: s.KeyUnbound.Load(), tierMutable: s.TierMutable.Load(),
	}
	if s.Tier != nil {
		ts := s.Tier.Stats()
		c.tierHits, c.tierMisses, c.tierEvictions = ts.Hits, ts.Misses, ts.Evictions
	}
	for i := range s.KeyRewrites {
		c.keyRewrites += s.KeyRewrites[i].Load()
	}
	for i := range c.codecRefused {
		c.codecRefused[i] = s.CodecRefused[i].Load()
	}
	for i := range c.keyRejected {
		c.keyRejected[i] = s.KeyRejected[i].Load()
	}
	for id := range c.requests {
		for oc := range c.requests[id] {
			c.requests[id][oc] = s.Requests[id][oc].Load()
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

// Reset makes "stats" count from now on, as memcached's "stats reset"
// does. The counters themselves never go back: Prometheus reads them, and
// a counter that falls is a restart to it.
func (s *Counters) Reset() {
	snap := s.snapshot()
	s.baseMu.Lock()
	s.base = snap
	s.baseMu.Unlock()
}

// sinceReset returns the counters as "stats" reports them.
func (s *Counters) sinceReset() counters {
	s.baseMu.Lock()
	base := s.base
	s.baseMu.Unlock()
	return s.snapshot().sub(base)
}

// Info is what the "stats" reply tells besides the counters.
type Info struct {
	Version   string
	Servers   int  // memcached servers, each once
	Codec     bool // values are enveloped: the codec's counters are told
	Keys      bool // key settings are on: the key counters are told
	TierLimit int64
}

// AppendStats writes the "stats" reply in memcached's format.
func (s *Counters) AppendStats(b []byte, p Info) []byte {
	now := time.Now()
	c := s.sinceReset()
	count := func(id int, oc Outcome) uint64 { return c.requests[id][oc] }
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
	str("version", p.Version)
	num("pointer_size", strconv.IntSize)
	str("rusage_user", rusage(ru.Utime))
	str("rusage_system", rusage(ru.Stime))
	num("curr_connections", uint64(s.CurrConns.Load()))
	num("total_connections", c.totalConns)
	// memcached's names for the same two counters.
	num("rejected_connections", c.connsRefused)
	num("idle_kicks", c.connsIdleClosed)
	num("cmd_get", c.cmdGet)
	num("cmd_set", c.cmdSet)
	num("cmd_flush", count(wire.CmdFlushAll, OutcomeOK))
	num("cmd_touch", c.cmdTouch+count(wire.CmdTouch, OutcomeOK)+count(wire.CmdTouch, OutcomeNotFound))
	num("get_hits", c.getHits)
	num("get_misses", c.getMisses)
	num("delete_misses", count(wire.CmdDelete, OutcomeNotFound))
	num("delete_hits", count(wire.CmdDelete, OutcomeOK))
	num("incr_misses", count(wire.CmdIncr, OutcomeNotFound))
	num("incr_hits", count(wire.CmdIncr, OutcomeOK))
	num("decr_misses", count(wire.CmdDecr, OutcomeNotFound))
	num("decr_hits", count(wire.CmdDecr, OutcomeOK))
	num("cas_misses", count(wire.CmdCas, OutcomeNotFound))
	num("cas_hits", count(wire.CmdCas, OutcomeStored))
	num("cas_badval", count(wire.CmdCas, OutcomeExists))
	num("touch_hits", c.touchHits+count(wire.CmdTouch, OutcomeOK))
	num("touch_misses", c.touchMiss+count(wire.CmdTouch, OutcomeNotFound))
	num("bytes_read", c.bytesRead)
	num("bytes_written", c.bytesWritten)
	num("threads", uint64(runtime.GOMAXPROCS(0)))
	num("upstream_servers", uint64(p.Servers))
	num("upstream_errors", c.upstreamErrors)
	num("upstream_gets", c.upstreamGets)
	num("upstream_get_keys", c.upGetKeys)
	// The proxy's own counters, named as the Prometheus metrics are
	// (less the prefix), so both views read alike.
	if p.Codec {
		for _, r := range codec.Reasons() {
			num("codec_verification_failures_"+r.String(), c.codecRefused[r&15])
		}
		num("codec_deleted", c.codecDeleted)
		num("codec_written_logical_bytes", c.codecLogical)
		num("codec_written_stored_bytes", c.codecStored)
	}
	if p.Keys {
		num("key_rewrites", c.keyRewrites)
		for _, r := range keyspace.Reasons() {
			num("key_rejected_"+r.String(), c.keyRejected[r&7])
		}
		num("key_unbound_items", c.keyUnbound)
	}
	if s.Tier != nil {
		ts := s.Tier.Stats()
		num("local_cache_hits", c.tierHits)
		num("local_cache_misses", c.tierMisses)
		num("local_cache_evictions", c.tierEvictions)
		num("local_cache_refused_mutable", c.tierMutable)
		num("local_cache_bytes", uint64(ts.Bytes))
		num("local_cache_entries", uint64(ts.Entries))
		num("local_cache_limit_bytes", uint64(p.TierLimit))
	}
	return append(b, wire.LineEnd...)
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}
