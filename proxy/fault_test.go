package proxy

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadWorker is one client of the restart test: it sets and gets its own
// keys on its own connection and holds every value it reads to the values
// it may legitimately read.
type loadWorker struct {
	id       int
	ops      int
	stored   int
	failed   int // sets answered SERVER_ERROR upstream …
	hits     int
	misses   int
	wrong    []string
	err      error
	recovery time.Duration // from the restart to the first set stored after it
	// recovered is set with recovery, for the test to watch while the
	// worker runs.
	recovered atomic.Bool
}

// run sends up to maxOps requests, alternating set and get over 50 keys,
// until stop is closed. After a set is stored, a get may return that value
// only; after a set that failed, its value too, since a failure does not
// say whether the server stored it; a miss is always allowed (the
// restarted server is empty). Anything else is a wrong value.
func (w *loadWorker) run(addr string, maxOps int, stop <-chan struct{}, restarted *atomic.Int64, progress *atomic.Int64) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		w.err = err
		return
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	allowed := map[string][]string{}
	for i := 0; i < maxOps; i++ {
		select {
		case <-stop:
			return
		default:
		}
		w.ops++
		k := "load:" + strconv.Itoa(w.id) + ":" + strconv.Itoa(i/2%50)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		ok := true
		if i%2 == 0 {
			v := k + "=" + strconv.Itoa(i)
			if _, err := fmt.Fprintf(nc, "set %s 0 0 %d\r\n%s\r\n", k, len(v), v); err != nil {
				w.err = err
				return
			}
			reply, err := readReply(br)
			if err != nil {
				w.err = fmt.Errorf("set %s: %w (read %q)", k, err, reply)
				return
			}
			switch {
			case reply == "STORED\r\n":
				allowed[k] = []string{v}
				w.stored++
				progress.Add(1)
				if at := restarted.Load(); at != 0 && w.recovery == 0 {
					w.recovery = time.Since(time.Unix(0, at))
					w.recovered.Store(true)
				}
			case strings.HasPrefix(reply, "SERVER_ERROR upstream "):
				allowed[k] = append(allowed[k], v)
				w.failed++
				ok = false
			default:
				w.wrong = append(w.wrong, fmt.Sprintf("set %s answered %q", k, reply))
			}
		} else {
			if _, err := fmt.Fprintf(nc, "get %s\r\n", k); err != nil {
				w.err = err
				return
			}
			reply, err := readReply(br)
			if err != nil {
				w.err = fmt.Errorf("get %s: %w (read %q)", k, err, reply)
				return
			}
			if reply == "END\r\n" {
				w.misses++
			} else if block, ok := strings.CutSuffix(reply, "END\r\n"); ok && strings.HasPrefix(block, "VALUE ") {
				switch value, good := w.checkValue(k, block, allowed[k]); {
				case !good:
					w.wrong = append(w.wrong, fmt.Sprintf("get %s answered %q, allowed %q", k, value, allowed[k]))
				default:
					w.hits++
				}
			} else {
				w.wrong = append(w.wrong, fmt.Sprintf("get %s answered %q", k, reply))
			}
		}
		if !ok {
			// Fast failures would spend the request budget at once.
			time.Sleep(time.Millisecond)
		}
	}
}

// checkValue parses one "VALUE k 0 n\r\ndata\r\n" block and reports
// whether data is one of allowed.
func (w *loadWorker) checkValue(k, block string, allowed []string) (string, bool) {
	head, data, found := strings.Cut(block, "\r\n")
	f := strings.Fields(head)
	if !found || len(f) != 4 || f[1] != k || f[2] != "0" {
		return block, false
	}
	n, err := strconv.Atoi(f[3])
	if err != nil || len(data) != n+2 {
		return block, false
	}
	value := data[:n]
	for _, a := range allowed {
		if value == a {
			return value, true
		}
	}
	return value, false
}

// TestMemcachedKilledAndRestartedUnderLoad kills the only memcached while
// four clients set and get through the proxy, and restarts it on the same
// port half a second later. Every request is answered (failures as
// SERVER_ERROR or a miss), no client ever reads a value it did not store,
// the server is ejected while it is down, and every client stores again
// within a bounded time after the restart, without any outside help.
func TestMemcachedKilledAndRestartedUnderLoad(t *testing.T) {
	upAddr, kill := startKillableMemcached(t)
	cfg := testConfig(upAddr)
	cfg.Timeout = 200 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.FailureLimit = 3
	cfg.RetryInterval = 50 * time.Millisecond
	p, addr := startProxy(t, cfg)
	srv := p.upstreams().Servers[0]

	const workers, maxOps = 4, 20000
	var restarted, progress atomic.Int64
	stop := make(chan struct{})
	ws := make([]*loadWorker, workers)
	var wg sync.WaitGroup
	for i := range ws {
		ws[i] = &loadWorker{id: i}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i].run(addr, maxOps, stop, &restarted, &progress)
		}()
	}
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopLoad()

	if !waitFor(5*time.Second, func() bool { return progress.Load() >= 200 }) {
		t.Fatalf("only %d sets stored before the kill", progress.Load())
	}
	kill()
	time.Sleep(500 * time.Millisecond)
	// Recovery is timed from when the restart begins.
	restarted.Store(time.Now().UnixNano())
	restartedOK := false
	for range 10 {
		if _, ok := runMemcached(t, upAddr); ok {
			restartedOK = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !restartedOK {
		t.Fatal("could not restart memcached on " + upAddr)
	}
	// Recovery is bounded by the retry interval and a probe; 10s is slack
	// for a loaded machine.
	const bound = 10 * time.Second
	recovered := waitFor(bound, func() bool {
		for _, w := range ws {
			if !w.recovered.Load() {
				return false
			}
		}
		return true
	})
	time.Sleep(200 * time.Millisecond) // some load on the restarted server
	stopLoad()

	var ops, stored, failed, hits, misses int
	var slowest time.Duration
	for _, w := range ws {
		if w.err != nil {
			t.Errorf("client %d: %v", w.id, w.err)
		}
		for _, wrong := range w.wrong {
			t.Errorf("client %d: %s", w.id, wrong)
		}
		ops, stored, failed, hits, misses = ops+w.ops, stored+w.stored, failed+w.failed, hits+w.hits, misses+w.misses
		slowest = max(slowest, w.recovery)
	}
	t.Logf("%d requests: %d sets stored, %d failed, %d hits, %d misses; slowest client stored again %v after the restart; %d ejections",
		ops, stored, failed, hits, misses, slowest.Round(time.Millisecond), srv.Ejections())
	if !recovered {
		t.Errorf("not every client stored again within %v of the restart", bound)
	}
	if failed == 0 {
		t.Error("no set failed while memcached was down: the kill was not felt")
	}
	if hits == 0 {
		t.Error("no get hit")
	}
	if srv.Ejections() == 0 {
		t.Error("the server was never ejected while down")
	}
	if srv.Ejected() {
		t.Error("the server is still ejected after it came back")
	}
}
