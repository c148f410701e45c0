package proxy

import (
	"context"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

var capablePass = regexp.MustCompile(`(?m)^ascii .*\[pass\]$`)

// TestMemccapable runs libmemcached's compliance checker against the proxy.
// Plain memcached passes all 27 ASCII tests and so must the proxy, with one
// upstream server and with three.
func TestMemccapable(t *testing.T) { runMemccapable(t, testConfig) }

// runMemccapable runs memccapable -a against a proxy built by config over
// one upstream server and over three; it must pass 27 of 27.
func runMemccapable(t *testing.T, config func(...string) Config) {
	bin := requireMemccapable(t)
	for _, servers := range []int{1, 3} {
		t.Run(itoa(servers)+" servers", func(t *testing.T) {
			var ups []string
			for range servers {
				ups = append(ups, startMemcached(t))
			}
			_, addr := startProxy(t, config(ups...))
			host, port := hostPort(addr)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "-a", "-h", host, "-p", port).CombinedOutput()
			passed := len(capablePass.FindAll(out, -1))
			t.Logf("memccapable -a: %d/27 passed", passed)
			if err != nil || passed != 27 {
				t.Fatalf("memccapable: %v, %d/27 passed\n%s", err, passed, out)
			}
		})
	}
}
