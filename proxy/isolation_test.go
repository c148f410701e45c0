package proxy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestIsolationUnderUpstreamFaults runs many seeds of a few clients, each
// with keys and values of its own, through the proxy in front of a fault
// forwarder in front of a real memcached, and holds every reply each
// client reads to what memcached could have answered that client's own
// request (see isoClient): never a byte of another client's reply, no
// value the client did not write, no counter operation applied twice.
// Misses, SERVER_ERROR replies and connections the proxy closes are
// allowed.
//
// Each seed draws its faults (faultConfig says where they land): one seed
// in five only delays and splits replies, which must change nothing; the
// others also truncate, close after a request, corrupt, duplicate and
// drop, each kind at a rate of its own or not at all.
//
// MCSIDECAR_ISOLATION_SEEDS sets the seeds per path (default 150),
// MCSIDECAR_ISOLATION_FIRST_SEED the first, and
// MCSIDECAR_ISOLATION_DURATION (e.g. 1h, with go test's -timeout above
// it) runs seeds until that much time has passed instead, half of it per
// path: values as they come, and every value enveloped. A failing seed
// runs alone with
// -run 'TestIsolationUnderUpstreamFaults/eventloop/seed=17$'.
func TestIsolationUnderUpstreamFaults(t *testing.T) {
	seeds, first, duration := isolationBudget(t)
	paths := []struct {
		name      string
		envelopes bool
	}{{"eventloop", false}, {"eventloop-envelopes", true}}
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			mc := startMemcached(t, "-m", "256")
			end := time.Now().Add(duration / time.Duration(len(paths)))
			var failed []uint64
			var injected [numFaultKinds]int64
			ran, i := 0, 0
			for ; duration > 0 && time.Now().Before(end) || duration == 0 && i < seeds; i++ {
				seed := first + uint64(i)
				t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
					ran++
					f := runIsolationSeed(t, mc, seed, path.envelopes)
					for k := range injected {
						injected[k] += f.injected[k].Load()
					}
					if t.Failed() {
						failed = append(failed, seed)
					}
				})
			}
			var kinds []string
			for k, n := range injected {
				kinds = append(kinds, fmt.Sprintf("%s %d", faultNames[k], n))
			}
			t.Logf("%d seeds run (of %d from %d), %d failed %v; faults injected: %s", ran, i, first, len(failed), failed, strings.Join(kinds, ", "))
		})
	}
}

// isolationBudget reads the seeds to run from the environment.
func isolationBudget(t *testing.T) (seeds int, first uint64, duration time.Duration) {
	seeds = 150
	if s := os.Getenv("MCSIDECAR_ISOLATION_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("MCSIDECAR_ISOLATION_SEEDS=%q: want a positive number", s)
		}
		seeds = n
	}
	if s := os.Getenv("MCSIDECAR_ISOLATION_FIRST_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MCSIDECAR_ISOLATION_FIRST_SEED=%q: %v", s, err)
		}
		first = n
	}
	if s := os.Getenv("MCSIDECAR_ISOLATION_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("MCSIDECAR_ISOLATION_DURATION=%q: want a positive duration", s)
		}
		duration = d
	}
	return seeds, first, duration
}

// isolationFaults draws a seed's faults.
func isolationFaults(rng *rand.Rand) faultConfig {
	var cfg faultConfig
	cfg.rates[faultDelay] = rng.Float64() * 0.3
	cfg.rates[faultSplit] = rng.Float64() * 0.3
	cfg.maxDelay = 3 * time.Millisecond
	if rng.IntN(4) == 0 {
		// Now and then longer than the proxy's timeout: a reply that
		// comes after its request was given up.
		cfg.maxDelay = 150 * time.Millisecond
		cfg.rates[faultDelay] /= 10
	}
	if rng.IntN(5) == 0 {
		return cfg
	}
	for _, k := range []faultKind{faultTruncate, faultCloseAfterRequest, faultCorrupt, faultDuplicate, faultDrop} {
		if rng.IntN(2) == 0 {
			cfg.rates[k] = 0.002 + rng.Float64()*0.02
			if k == faultTruncate || k == faultCloseAfterRequest {
				// Drawn per write, of which an event loop makes few.
				cfg.rates[k] *= 3
			}
		}
	}
	return cfg
}

// runIsolationSeed runs one seed: a proxy in front of a fault forwarder
// in front of the memcached at mc, and two to six checking clients. It
// returns the forwarder, whose counts say what was injected.
func runIsolationSeed(t *testing.T, mc string, seed uint64, envelopes bool) *faultForwarder {
	rng := rand.New(rand.NewPCG(seed, 0))
	faults := isolationFaults(rng)
	fwd := startFaultForwarder(t, mc, seed, faults)
	cfg := testConfig(fwd.addr)
	if envelopes {
		// Every value enveloped: appends and counters are
		// read-modify-writes, and every value read is checked.
		cfg = envelopeAllConfig(fwd.addr)
	}
	// Short, so that a reply a fault cut short is given up soon.
	cfg.Timeout = 100 * time.Millisecond
	_, addr := startProxy(t, cfg)

	shape := isoShape{maxBatch: 12, maxKeys: 5, dataKeys: 6, bigValues: 0.05}
	clients := make([]*isoClient, 2+rng.IntN(5))
	batches := 4 + rng.IntN(8)
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	for i := range clients {
		clients[i] = newIsoClient(i, seed, shape)
		wg.Go(func() { clients[i].run(addr, batches, deadline) })
	}
	wg.Wait()
	reportIsoClients(t, clients)
	if t.Failed() {
		var kinds []string
		for k := range faults.rates {
			if faults.rates[k] > 0 {
				kinds = append(kinds, fmt.Sprintf("%s %.3f (%d)", faultNames[k], faults.rates[k], fwd.injected[k].Load()))
			}
		}
		t.Logf("faults (rate, injected): %s; delays up to %v", strings.Join(kinds, ", "), faults.maxDelay)
	}
	return fwd
}

// reportIsoClients fails the test with the clients' problems.
func reportIsoClients(t *testing.T, clients []*isoClient) {
	t.Helper()
	for _, c := range clients {
		for _, p := range c.problems {
			t.Error(p)
		}
	}
}
