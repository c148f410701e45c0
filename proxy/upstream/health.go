package upstream

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// errEjected fails a request to a server that is ejected, before anything
// is sent: it answers like a server that is down.
var errEjected = errors.New("upstream server ejected")

// health is the one state machine of an upstream server's health:
//
//	ok ──failure──▶ failing ──limit failures──▶ ejected
//	 ▲                 │                           │
//	 └────answer───────┘◀──────probe answers───────┘
//
// A failure is a connect error, a timeout or a broken connection; a reply
// of any kind, a miss or a SERVER_ERROR included, is an answer. Each
// change is logged once, so an outage logs "failing", then "ejected" and
// "back" if it lasted limit failures, or "answers again" if it did not.
// An ejected server is not used: every request to it fails at once,
// without touching the network, so no client waits on a server known to
// be dead. With limit 0 a server fails but is never ejected.
//
// While the server is ejected, one goroutine of its own probes it with
// "version" every interval and puts it back at the first answer. A
// background prober rather than a probe by the first request after the
// interval: no client request ever pays for a probe of a dead server, and
// the prober exists only while the server is out. close stops it.
type health struct {
	name     string
	limit    int32 // consecutive failures that eject; 0 never ejects
	interval time.Duration
	probe    func() error // one request that bypasses the ejection
	log      *slog.Logger

	fails     atomic.Int32
	failing   atomic.Bool // failed since its last answer: failing or ejected
	down      atomic.Bool // ejected
	ejections atomic.Uint64

	mu      sync.Mutex
	closed  bool
	since   time.Time // when the server was ejected
	stop    chan struct{}
	probers sync.WaitGroup
}

func newHealth(name string, o *Options, probe func() error) *health {
	return &health{
		name:     name,
		limit:    int32(o.FailureLimit),
		interval: o.RetryInterval,
		probe:    probe,
		log:      o.Log,
		stop:     make(chan struct{}),
	}
}

// admit refuses a request to an ejected server.
func (h *health) admit() error {
	if h.down.Load() {
		return errEjected
	}
	return nil
}

// observe counts the result of one request to the server, ejects it at the
// failure limit, and returns err.
func (h *health) observe(err error) error {
	if err == nil || errors.Is(err, errEjected) {
		h.answered()
		return err
	}
	k := failureKind(err)
	if k == KindNone {
		h.answered()
		return err
	}
	if h.failing.CompareAndSwap(false, true) {
		h.log.Warn("upstream failing", "server", h.name, "kind", k.String(), "err", err)
	}
	if h.limit > 0 && h.fails.Add(1) >= h.limit {
		h.eject()
	}
	return err
}

// answered records an answer: the failure count starts again, and a server
// that was failing, but not ejected, is logged as answering again. Loads
// come first: the common case writes nothing shared.
func (h *health) answered() {
	if h.fails.Load() != 0 {
		h.fails.Store(0)
	}
	if h.failing.Load() && !h.down.Load() && h.failing.CompareAndSwap(true, false) {
		h.log.Info("upstream answers again", "server", h.name)
	}
}

// failureKind says whether err is a failure of the server itself, and of
// which kind: KindNone for an answer or an error of the request.
func failureKind(err error) Kind {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return KindConnect
	case IsTimeout(err):
		return KindTimeout
	case isConnError(err):
		return KindConnection
	}
	return KindNone
}

// eject takes the server out and starts its prober, once however many
// requests fail together.
func (h *health) eject() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.down.Load() {
		return
	}
	h.down.Store(true)
	h.ejections.Add(1)
	h.since = time.Now()
	h.log.Warn("upstream server ejected", "server", h.name, "failures", h.fails.Load(), "retry_interval", h.interval)
	h.probers.Add(1)
	go h.probeUntilBack()
}

// probeUntilBack probes the ejected server every interval, and puts it
// back when it answers. A failed probe keeps it out another interval.
func (h *health) probeUntilBack() {
	defer h.probers.Done()
	t := time.NewTimer(h.interval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		if h.probe() == nil {
			break
		}
		t.Reset(h.interval)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fails.Store(0)
	h.failing.Store(false)
	h.down.Store(false)
	h.log.Info("upstream server back", "server", h.name, "ejected_for", time.Since(h.since).Round(time.Millisecond))
}

// close stops the prober, if one runs, and waits for it. A probe in flight
// ends within the upstream timeout.
func (h *health) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.stop)
	}
	h.mu.Unlock()
	h.probers.Wait()
}

// Per-server health metrics. Every server of the current set is exported,
// up or not, with its ejections counted from zero.
var (
	serverUpDesc = prometheus.NewDesc("mcsidecar_upstream_server_up",
		"Whether an upstream server is in use: 1, or 0 while it is ejected after --upstream-failure-limit consecutive failures.", []string{"server"}, nil)
	ejectionsDesc = prometheus.NewDesc("mcsidecar_upstream_ejections_total",
		"Times an upstream server was ejected.", []string{"server"}, nil)
)

// DescribeHealth sends the descriptions of the per-server health metrics.
func DescribeHealth(ch chan<- *prometheus.Desc) {
	ch <- serverUpDesc
	ch <- ejectionsDesc
}

// CollectHealth sends the health metrics of servers.
func CollectHealth(ch chan<- prometheus.Metric, servers []*Server) {
	for _, s := range servers {
		up := 1.0
		if s.health.down.Load() {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(serverUpDesc, prometheus.GaugeValue, up, s.name)
		ch <- prometheus.MustNewConstMetric(ejectionsDesc, prometheus.CounterValue, float64(s.health.ejections.Load()), s.name)
	}
}
