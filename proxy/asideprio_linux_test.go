//go:build linux

package proxy

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWorkersRunBelowTheLoops: each worker that opens retrievals aside has
// a thread of its own at a nice value asideNice above the process's, and
// the process a P for each worker besides those it had.
func TestWorkersRunBelowTheLoops(t *testing.T) {
	startProxy(t, testConfig(startMemcached(t)))
	n := asideWorkers()
	if got := runtime.GOMAXPROCS(0); got != 2*n {
		t.Errorf("GOMAXPROCS is %d with %d workers, want %d", got, n, 2*n)
	}
	want := min(19, processNice(t)+asideNice)
	if lowered := waitThreadsAt(t, want, n); lowered < n {
		t.Errorf("%d threads at nice %d, want at least the %d workers'", lowered, want, n)
	}
}

// TestHeavyLoopsRunBelowTheFirst: with --event-loops -1, each loop but the
// first has a thread of its own at a nice value heavyNice above the
// process's.
func TestHeavyLoopsRunBelowTheFirst(t *testing.T) {
	if !loopsMove {
		t.Skip("the portable poller moves no client: no loop is one of heavy clients")
	}
	cfg := testConfig(startMemcached(t))
	cfg.EventLoops = EventLoopsAuto
	startProxy(t, cfg)
	n := autoLoops() - 1
	want := min(19, processNice(t)+heavyNice)
	if lowered := waitThreadsAt(t, want, n); lowered < n {
		t.Errorf("%d threads at nice %d, want at least the %d heavy loops'", lowered, want, n)
	}
}

// waitThreadsAt waits up to 5 s for n of the process's threads to run at
// nice value nice, and returns how many do.
func waitThreadsAt(t *testing.T, nice, n int) int {
	t.Helper()
	var lowered int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tasks, err := filepath.Glob("/proc/self/task/*/stat")
		if err != nil {
			t.Fatal(err)
		}
		lowered = 0
		for _, f := range tasks {
			if niceOf(t, f) == nice {
				lowered++
			}
		}
		if lowered >= n {
			break
		}
	}
	return lowered
}

// processNice is the nice value the process's threads begin with: the
// calling goroutine's thread's, which is none of the lowered ones (a
// lowered thread runs only its loop or worker, and is ended or, if it is
// the main thread, left idle with it).
func processNice(t *testing.T) int {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return niceOf(t, "/proc/thread-self/stat")
}

// niceOf reads the nice value from a /proc stat file: the 19th field,
// the 17th after the command name in parentheses.
func niceOf(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return -100 // a thread that ended meanwhile
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 17 {
		t.Fatalf("%s: %q", path, b)
	}
	v, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatalf("%s: nice %q", path, f[16])
	}
	return v
}
