package upstream

import (
	"bytes"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Kind is why an upstream request failed, the "kind" label of the
// upstream error metric. Cache outcomes (miss, not stored, exists) and
// memcached refusing a client's own request (a CLIENT_ERROR, an item over
// its size limit) are answers, not failures.
type Kind uint8

// Kinds of upstream failure.
const (
	KindNone        Kind = iota // not a failure
	KindConnect                 // no connection could be made
	KindTimeout                 // the server did not answer in time
	KindConnection              // a connection broke: reset, closed
	KindServerError             // the server answered SERVER_ERROR
	KindProtocol                // a reply the proxy could not read
	KindEjected                 // not sent: the server is ejected
	NumKinds
)

var kindNames = [NumKinds]string{"", "connect", "timeout", "connection", "server_error", "protocol", "ejected"}

// String returns the kind's metric label.
func (k Kind) String() string { return kindNames[k] }

// kindOf sorts an upstream error. It is called only on the error path.
func kindOf(err error) Kind {
	if err == nil {
		return KindNone
	}
	if errors.Is(err, errEjected) {
		return KindEjected
	}
	line, relayed := RelayedLine(err.Error())
	if relayed && bytes.Equal(line, replyTooLarge) {
		// The server's item limit, not a failure of the server.
		return KindNone
	}
	if k := failureKind(err); k != KindNone {
		return k
	}
	if relayed && len(line) > 0 && line[0] == 'S' {
		return KindServerError
	}
	return KindProtocol
}

// Totals are the proxy-wide counters every server adds to, for "stats"
// and the metrics: upstream errors of every kind, get batches sent and the
// keys in them, and the latency histogram, by server.
type Totals struct {
	Errors  *atomic.Uint64
	Gets    *atomic.Uint64
	GetKeys *atomic.Uint64
	Latency *prometheus.HistogramVec
}

// serverStats counts the requests one upstream server was sent, its
// failures by kind and its latency. Every request to the server, through
// gomemcache or the proxy's own pool, passes through observe.
type serverStats struct {
	name     string
	all      Totals // the proxy-wide counters
	requests atomic.Uint64
	errors   [NumKinds]atomic.Uint64
	protocol [NumReasons]atomic.Uint64 // connections found out of step
	latency  prometheus.Observer
}

func newServerStats(name string, all Totals) *serverStats {
	return &serverStats{name: name, all: all, latency: all.Latency.WithLabelValues(name)}
}

// serverError counts a SERVER_ERROR reply to one command of a batch that
// was otherwise answered.
func (s *serverStats) serverError() {
	s.errors[KindServerError].Add(1)
	s.all.Errors.Add(1)
}

// observe records one request to the server that began at start. A request
// refused because the server is ejected was never sent: it counts as an
// error of its own kind only.
func (s *serverStats) observe(start time.Time, err error) {
	if errors.Is(err, errEjected) {
		s.errors[KindEjected].Add(1)
		s.all.Errors.Add(1)
		return
	}
	s.requests.Add(1)
	s.latency.Observe(time.Since(start).Seconds())
	if k := kindOf(err); k != KindNone {
		s.errors[k].Add(1)
		s.all.Errors.Add(1)
	}
}
