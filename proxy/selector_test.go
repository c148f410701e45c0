package proxy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"mcsidecar/proxy/upstream"

	"github.com/bradfitz/gomemcache/memcache"
)

// TestKetamaPlacesKeysWhereTwemproxyDoes stores keys through twemproxy
// (ketama distribution, md5 hash) and reads them back through the proxy
// with --upstream-selector=ketama: every key must be found, so both put it
// on the same server.
func TestKetamaPlacesKeysWhereTwemproxyDoes(t *testing.T) {
	bin, err := exec.LookPath("nutcracker")
	if err != nil {
		t.Fatalf("nutcracker is not installed (the README's test command installs it): %v", err)
	}
	ups := []string{startMemcached(t), startMemcached(t), startMemcached(t)}
	dir := t.TempDir()
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	conf := "pool:\n  listen: " + listen + "\n  hash: md5\n  distribution: ketama\n  auto_eject_hosts: false\n  redis: false\n  servers:\n"
	for _, u := range ups {
		conf += "   - " + u + ":1\n"
	}
	confPath := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", confPath, "-s", strconv.Itoa(freePort(t)), "-a", "127.0.0.1",
		"-o", filepath.Join(dir, "nutcracker.log"), "-p", filepath.Join(dir, "nutcracker.pid"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	if !waitListening(listen, exited) {
		t.Fatal("nutcracker did not start")
	}

	const n = 300
	var sets, gets strings.Builder
	gets.WriteString("get")
	for i := range n {
		fmt.Fprintf(&sets, "set ketama:%d 0 0 1\r\nx\r\n", i)
		fmt.Fprintf(&gets, " ketama:%d", i)
	}
	gets.WriteString("\r\n")
	if got := exchange(t, listen, sets.String()); got != strings.Repeat("STORED\r\n", n) {
		t.Fatalf("storing through twemproxy: %q", short(got))
	}
	cfg := testConfig(ups...)
	cfg.Selector = upstream.SelectKetama
	_, addr := startProxy(t, cfg)
	got := exchange(t, addr, gets.String())
	if hits := strings.Count(got, "VALUE "); hits != n {
		t.Fatalf("the proxy found %d of %d keys twemproxy stored", hits, n)
	}
	// The servers must really share the keys, or the check proves little.
	for _, u := range ups {
		if got := exchange(t, u, gets.String()); strings.Count(got, "VALUE ") == 0 {
			t.Fatalf("server %s holds none of the keys", u)
		}
	}
}

// TestGomemcachePlacesKeysWhereTheProxyDoes: a gomemcache client built on
// ServerSelector and a proxy over the same servers, listed in other
// orders, put every key on the same memcached: values one stores directly
// the other finds, for both selectors and several server counts.
func TestGomemcachePlacesKeysWhereTheProxyDoes(t *testing.T) {
	for _, tc := range []struct {
		scheme  string
		servers int
	}{{upstream.SelectJump, 1}, {upstream.SelectJump, 2}, {upstream.SelectJump, 3}, {upstream.SelectJump, 5}, {upstream.SelectKetama, 3}} {
		t.Run(fmt.Sprintf("%s over %d", tc.scheme, tc.servers), func(t *testing.T) {
			var addrs []string
			for range tc.servers {
				addrs = append(addrs, startMemcached(t))
			}
			cfg := testConfig(addrs...)
			cfg.Selector = tc.scheme
			_, via := startProxy(t, cfg)
			reversed := slices.Clone(addrs)
			slices.Reverse(reversed)
			ss, err := NewServerSelector(tc.scheme, reversed)
			if err != nil {
				t.Fatal(err)
			}
			direct := memcache.NewFromSelector(ss)
			proxied := memcache.New(via)
			perServer := make(map[string]int)
			for i := range 200 {
				// Keys a store-gateway sends, and keys of the proxy's test
				// load; every one stored by one client, read by the other.
				key := fmt.Sprintf("P2:tenant-%d:01HZ%022d:label", i%7, i)
				writer, reader := direct, proxied
				if i%2 == 1 {
					writer, reader = proxied, direct
				}
				value := []byte(strconv.Itoa(i))
				if err := writer.Set(&memcache.Item{Key: key, Value: value}); err != nil {
					t.Fatalf("set %s: %v", key, err)
				}
				it, err := reader.Get(key)
				if err != nil {
					t.Fatalf("key %s stored by one client is %v for the other", key, err)
				}
				if string(it.Value) != string(value) {
					t.Fatalf("key %s: %q, want %q", key, it.Value, value)
				}
				a, _ := ss.PickServer(key)
				perServer[a.String()]++
			}
			if len(perServer) != tc.servers {
				t.Errorf("keys landed on %d of %d servers: %v", len(perServer), tc.servers, perServer)
			}
		})
	}
}
