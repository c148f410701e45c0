package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"mcsidecar/proxy/memcachedtest"
)

// runLocal is one run of .ci/run-local, in a process group of its own as
// a terminal would start it.
type runLocal struct {
	cmd                                   *exec.Cmd
	out                                   string // the file its output goes to
	exited                                chan struct{}
	waitErr                               error
	memcachedPort, proxyPort, metricsPort string
}

// output returns what the script and its children printed so far.
func (r *runLocal) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(r.out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startRunLocal runs the script with the ports of three free loopback
// addresses: the memcached one given by MEMCACHED_PORT in the environment,
// the two others by flags, so both ways are used. It returns once the
// sidecar answers on both, or fails the test. A port another test took
// first makes the script fail or find a stranger's memcached: it is run
// again on other ports.
func startRunLocal(t *testing.T, args ...string) *runLocal {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := exec.LookPath("memcached"); err != nil {
		t.Fatalf("memcached is not installed (the README's test command installs it): %v", err)
	}
	for attempt := 1; ; attempt++ {
		r, err := tryRunLocal(t, args...)
		if err == nil {
			return r
		}
		if attempt == 3 {
			t.Fatalf("run-local: %v\n%s", err, r.output(t))
		}
		t.Logf("run-local, attempt %d: %v; again on other ports", attempt, err)
	}
}

func tryRunLocal(t *testing.T, args ...string) (*runLocal, error) {
	t.Helper()
	ports := make([]string, 3)
	for i, a := range memcachedtest.FreeAddrs(t, 3) {
		_, ports[i], _ = net.SplitHostPort(a)
	}
	r := &runLocal{out: filepath.Join(t.TempDir(), "out"), exited: make(chan struct{}),
		memcachedPort: ports[0], proxyPort: ports[1], metricsPort: ports[2]}
	// A file, not a pipe: a child the script left running would hold a
	// pipe open, and Wait would wait for it.
	f, err := os.Create(r.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r.cmd = exec.Command("bash", append([]string{"../../.ci/run-local", "--proxy-port", r.proxyPort, "--metrics-port=" + r.metricsPort}, args...)...)
	r.cmd.Env = append(os.Environ(), "MEMCACHED_PORT="+r.memcachedPort)
	r.cmd.Stdout, r.cmd.Stderr = f, f
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.waitErr = r.cmd.Wait(); close(r.exited) }()
	// Whatever happens, nothing of the group outlives the test.
	t.Cleanup(func() {
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.exited
	})
	// The script builds the sidecar first: give it time on a busy machine.
	for deadline := time.Now().Add(3 * time.Minute); !dialable("127.0.0.1:"+r.proxyPort) || !dialable("127.0.0.1:"+r.metricsPort); {
		select {
		case <-r.exited:
			return r, fmt.Errorf("exited before the sidecar answered: %v", r.waitErr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar does not answer on %s and %s\n%s", r.proxyPort, r.metricsPort, r.output(t))
		}
	}
	return r, nil
}

// stop sends sig to the script, or to its whole group as Ctrl-C does, and
// waits for it to exit.
func (r *runLocal) stop(t *testing.T, sig syscall.Signal, group bool) {
	t.Helper()
	pid := r.cmd.Process.Pid
	if group {
		pid = -pid
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after %v\n%s", sig, r.output(t))
	}
}

var startedMemcached = regexp.MustCompile(`started memcached on 127\.0\.0\.1:(\d+) \(pid (\d+)\)`)

// TestRunLocalStopsTheMemcachedItStartedAtCtrlC runs .ci/run-local on
// free ports, checks that the sidecar serves from the memcached the script
// started there, then sends the process group SIGINT, as Ctrl-C does: the
// script, the sidecar and that memcached must all be gone.
func TestRunLocalStopsTheMemcachedItStartedAtCtrlC(t *testing.T) {
	var r *runLocal
	var pid int
	for attempt := 1; ; attempt++ {
		r = startRunLocal(t)
		m := startedMemcached.FindStringSubmatch(r.output(t))
		if m != nil && m[1] == r.memcachedPort {
			pid, _ = strconv.Atoi(m[2])
			break
		}
		// Someone else's memcached answered on the port first: the
		// script rightly left it alone.
		r.stop(t, syscall.SIGTERM, false)
		if attempt == 3 {
			t.Fatalf("the script started no memcached on %s\n%s", r.memcachedPort, r.output(t))
		}
	}
	mc := sidecar{listen: "127.0.0.1:" + r.memcachedPort}
	if got := mc.do(t, "stats\r\n"); !strings.Contains(got, fmt.Sprintf("STAT pid %d\r\n", pid)) {
		t.Fatalf("the memcached on %s is not pid %d:\n%s", r.memcachedPort, pid, got)
	}
	s := sidecar{listen: "127.0.0.1:" + r.proxyPort, metrics: "127.0.0.1:" + r.metricsPort}
	if got := s.do(t, "set run-local 0 0 2\r\nhi\r\n"); got != "STORED\r\n" {
		t.Fatalf("set through the sidecar answered %q", got)
	}
	if got, want := mc.do(t, "get run-local\r\n"), "VALUE run-local 0 2\r\nhi\r\nEND\r\n"; got != want {
		t.Fatalf("the script's memcached answered %q, want %q: the sidecar does not use it", got, want)
	}

	r.stop(t, syscall.SIGINT, true)
	var exit *exec.ExitError
	if !errors.As(r.waitErr, &exit) || exit.ExitCode() != 130 {
		t.Errorf("the script exited with %v, want status 130 (interrupted)", r.waitErr)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("memcached pid %d is still there after Ctrl-C (kill -0: %v)\n%s", pid, err, r.output(t))
	}
	for _, port := range []string{r.memcachedPort, r.proxyPort, r.metricsPort} {
		if dialable("127.0.0.1:" + port) {
			t.Errorf("port %s still answers after Ctrl-C", port)
		}
	}
	if !strings.Contains(r.output(t), "stopped memcached on 127.0.0.1:"+r.memcachedPort) {
		t.Errorf("the script did not say it stopped memcached:\n%s", r.output(t))
	}
}

// TestRunLocalUpstreamReplacesTheDefault gives the script an --upstream of
// the test's own memcached: the sidecar must have that server alone, and
// the script must start no memcached of its own. SIGTERM to the script
// alone stops the sidecar too.
func TestRunLocalUpstreamReplacesTheDefault(t *testing.T) {
	up := memcachedtest.Start(t)
	r := startRunLocal(t, "--upstream="+up)
	if out := r.output(t); strings.Contains(out, "started memcached") {
		t.Errorf("the script started a memcached though --upstream names one:\n%s", out)
	}
	if dialable("127.0.0.1:" + r.memcachedPort) {
		t.Errorf("something answers on the default memcached port %s", r.memcachedPort)
	}
	s := sidecar{listen: "127.0.0.1:" + r.proxyPort, metrics: "127.0.0.1:" + r.metricsPort}
	mfs := s.scrape(t)
	if n := mfs["mcsidecar_upstream_servers"].GetMetric(); len(n) != 1 || n[0].GetGauge().GetValue() != 1 {
		t.Errorf("mcsidecar_upstream_servers %v, want 1: the user's --upstream alone", n)
	}
	if got := s.do(t, "set run-local 0 0 2\r\nhi\r\n"); got != "STORED\r\n" {
		t.Fatalf("set through the sidecar answered %q", got)
	}
	if got, want := (sidecar{listen: up}).do(t, "get run-local\r\n"), "VALUE run-local 0 2\r\nhi\r\nEND\r\n"; got != want {
		t.Errorf("the user's memcached answered %q, want %q", got, want)
	}

	r.stop(t, syscall.SIGTERM, false)
	if dialable("127.0.0.1:" + r.proxyPort) {
		t.Errorf("the sidecar still answers after the script was stopped\n%s", r.output(t))
	}
}
