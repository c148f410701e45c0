// Package memcachedtest starts the real memcached that tests outside the
// proxy package talk to, each on a loopback port of its own.
package memcachedtest

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CloseInherited marks every descriptor of the process from 3 up
// close-on-exec, so that a server a test starts holds none of those the
// process inherited. A fuzz worker inherits its pipes to the coordinator
// that way: a memcached that kept them would outlive a worker the
// coordinator stopped or lost, and the coordinator would wait for the
// worker's end forever. Descriptors Go opens are close-on-exec already.
// Outside Linux (no /proc/self/fd) it does nothing.
func CloseInherited() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// FreeAddr returns a loopback address with a port free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// FreeAddrs returns n loopback addresses with ports free a moment ago, no
// two alike: each port is held until all are picked, which FreeAddr called
// n times does not do.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// WaitDial waits until addr accepts connections.
func WaitDial(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not accept connections: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Start runs a real memcached on a loopback port of its own for the
// test's lifetime and returns its address.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		t.Fatalf("memcached is not installed (the README's test command installs it): %v", err)
	}
	// Tests of other packages start memcached on free ports at the same
	// time: one that lost the race for a port exits, and another's server
	// may answer on it. memcached's stats name the pid that listens.
	for range 5 {
		addr := FreeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		// 64 MB, memcached's default: each slab class of large values
		// takes a 1 MB page, and a load of values of many sizes (raw
		// postings) evicts some under 16 MB.
		cmd := exec.Command(bin, "-l", "127.0.0.1", "-p", port, "-U", "0", "-t", "1", "-m", "64", "-u", "nobody")
		CloseInherited()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		WaitDial(t, addr)
		if statsPid(addr) == strconv.Itoa(cmd.Process.Pid) {
			return addr
		}
		cmd.Process.Kill()
	}
	t.Fatal("could not start memcached on a port of its own")
	return ""
}

// statsPid returns the pid the memcached on addr reports, or "".
func statsPid(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return ""
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() && sc.Text() != "END" {
		if v, ok := strings.CutPrefix(sc.Text(), "STAT pid "); ok {
			return v
		}
	}
	return ""
}
