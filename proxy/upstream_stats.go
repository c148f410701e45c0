package proxy

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// errKind is why an upstream request failed, the "kind" label of the
// upstream error metric. Cache outcomes (miss, not stored, exists) and
// memcached refusing a client's own request (a CLIENT_ERROR, an item over
// its size limit) are answers, not failures.
type errKind uint8

const (
	kindNone        errKind = iota // not a failure
	kindConnect                    // no connection could be made
	kindTimeout                    // the server did not answer in time
	kindConnection                 // a connection broke: reset, closed
	kindServerError                // the server answered SERVER_ERROR
	kindProtocol                   // a reply the proxy could not read
	kindEjected                    // not sent: the server is ejected
	numKinds
)

var kindNames = [numKinds]string{"", "connect", "timeout", "connection", "server_error", "protocol", "ejected"}

// kindOf sorts an upstream error. It is called only on the error path.
func kindOf(err error) errKind {
	if err == nil {
		return kindNone
	}
	if errors.Is(err, errEjected) {
		return kindEjected
	}
	if _, oc := upstreamReply(err); oc != outcomeUpstreamError {
		return kindNone
	}
	if k := failureKind(err); k != kindNone {
		return k
	}
	if line, ok := relayedLine(err.Error()); ok && len(line) > 0 && line[0] == 'S' {
		return kindServerError
	}
	return kindProtocol
}

// serverStats counts the requests one upstream server was sent, its
// failures by kind and its latency. Every request to the server, through
// gomemcache or the proxy's own pool, passes through observe.
type serverStats struct {
	name     string
	log      *slog.Logger
	all      *stats // the proxy-wide error total, for "stats"
	requests atomic.Uint64
	errors   [numKinds]atomic.Uint64
	latency  prometheus.Observer
}

func newServerStats(name string, st *stats) *serverStats {
	return &serverStats{name: name, log: st.log, all: st, latency: st.upstreamLatency.WithLabelValues(name)}
}

// observe records one request to the server that began at start. A request
// refused because the server is ejected was never sent: it counts as an
// error of its own kind only.
// serverError counts a SERVER_ERROR reply to one command of a batch that
// was otherwise answered.
func (s *serverStats) serverError() {
	s.errors[kindServerError].Add(1)
	s.all.upstreamErrors.Add(1)
}

func (s *serverStats) observe(start time.Time, err error) {
	if errors.Is(err, errEjected) {
		s.errors[kindEjected].Add(1)
		s.all.upstreamErrors.Add(1)
		return
	}
	s.requests.Add(1)
	s.latency.Observe(time.Since(start).Seconds())
	if k := kindOf(err); k != kindNone {
		s.errors[k].Add(1)
		s.all.upstreamErrors.Add(1)
	}
}
