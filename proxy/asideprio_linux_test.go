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
	want := min(19, niceOf(t, "/proc/self/stat")+asideNice)
	var lowered int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tasks, err := filepath.Glob("/proc/self/task/*/stat")
		if err != nil {
			t.Fatal(err)
		}
		lowered = 0
		for _, f := range tasks {
			if niceOf(t, f) == want {
				lowered++
			}
		}
		if lowered >= n {
			return
		}
	}
	t.Errorf("%d threads at nice %d, want at least the %d workers'", lowered, want, n)
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
