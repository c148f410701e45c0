package proxy

import (
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// stats holds the counters the memcached "stats" command reports, kept with
// atomics so that connections never contend on a lock. The Prometheus
// metrics read the same counters.
type stats struct {
	started time.Time

	currConns, totalConns    atomic.Int64
	bytesRead, bytesWritten  atomic.Uint64
	cmdGet, cmdSet, cmdTouch atomic.Uint64
	getHits, getMisses       atomic.Uint64
	touchHits, touchMisses   atomic.Uint64
	upstreamErrors           atomic.Uint64
	upstreamGets             atomic.Uint64 // get requests sent upstream
	upstreamGetKeys          atomic.Uint64 // keys in them
	requests                 [numCommands][numOutcomes]atomic.Uint64
}

func newStats() *stats { return &stats{started: time.Now()} }

// record counts one request of command id with its outcome.
func (s *stats) record(id int, oc outcome) { s.requests[id][oc].Add(1) }

// recordKey counts one key of a retrieval, as memcached counts get_hits.
func (s *stats) recordKey(touch, hit bool) {
	switch {
	case touch && hit:
		s.cmdTouch.Add(1)
		s.touchHits.Add(1)
	case touch:
		s.cmdTouch.Add(1)
		s.touchMisses.Add(1)
	case hit:
		s.cmdGet.Add(1)
		s.getHits.Add(1)
	default:
		s.cmdGet.Add(1)
		s.getMisses.Add(1)
	}
}

// reset zeroes what "stats reset" zeroes in memcached: the counters, not
// the connection gauges.
func (s *stats) reset() {
	for _, c := range []*atomic.Uint64{
		&s.bytesRead, &s.bytesWritten, &s.cmdGet, &s.cmdSet, &s.cmdTouch,
		&s.getHits, &s.getMisses, &s.touchHits, &s.touchMisses, &s.upstreamErrors,
		&s.upstreamGets, &s.upstreamGetKeys,
	} {
		c.Store(0)
	}
	s.totalConns.Store(0)
}

func (s *stats) count(id int, oc outcome) uint64 { return s.requests[id][oc].Load() }

// appendStats writes the "stats" reply in memcached's format.
func (s *stats) appendStats(b []byte, p *Proxy) []byte {
	now := time.Now()
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	num := func(name string, v uint64) {
		b = append(b, replyStat...)
		b = append(b, name...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, v, 10)
		b = append(b, crlf...)
	}
	str := func(name, v string) {
		b = append(b, replyStat...)
		b = append(b, name...)
		b = append(b, ' ')
		b = append(b, v...)
		b = append(b, crlf...)
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
	num("total_connections", uint64(s.totalConns.Load()))
	num("cmd_get", s.cmdGet.Load())
	num("cmd_set", s.cmdSet.Load())
	num("cmd_flush", s.count(cmdFlushAll, outcomeOK))
	num("cmd_touch", s.cmdTouch.Load()+s.count(cmdTouch, outcomeOK)+s.count(cmdTouch, outcomeNotFound))
	num("get_hits", s.getHits.Load())
	num("get_misses", s.getMisses.Load())
	num("delete_misses", s.count(cmdDelete, outcomeNotFound))
	num("delete_hits", s.count(cmdDelete, outcomeOK))
	num("incr_misses", s.count(cmdIncr, outcomeNotFound))
	num("incr_hits", s.count(cmdIncr, outcomeOK))
	num("decr_misses", s.count(cmdDecr, outcomeNotFound))
	num("decr_hits", s.count(cmdDecr, outcomeOK))
	num("cas_misses", s.count(cmdCas, outcomeNotFound))
	num("cas_hits", s.count(cmdCas, outcomeStored))
	num("cas_badval", s.count(cmdCas, outcomeExists))
	num("touch_hits", s.touchHits.Load()+s.count(cmdTouch, outcomeOK))
	num("touch_misses", s.touchMisses.Load()+s.count(cmdTouch, outcomeNotFound))
	num("bytes_read", s.bytesRead.Load())
	num("bytes_written", s.bytesWritten.Load())
	num("threads", uint64(runtime.GOMAXPROCS(0)))
	num("upstream_servers", uint64(len(p.servers)))
	num("upstream_errors", s.upstreamErrors.Load())
	num("upstream_gets", s.upstreamGets.Load())
	num("upstream_get_keys", s.upstreamGetKeys.Load())
	return append(b, replyEnd...)
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}
