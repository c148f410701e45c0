package proxy

import (
	"strings"
	"testing"

	"mcsidecar/proxy/upstream"
)

// statNames returns the STAT names of a stats reply, and whether it ends
// with END as memcached's replies do.
func statNames(reply string) (map[string]string, bool) {
	names := map[string]string{}
	lines := strings.Split(strings.TrimSuffix(reply, "\r\n"), "\r\n")
	for _, l := range lines[:len(lines)-1] {
		f := strings.SplitN(l, " ", 3)
		if len(f) == 3 && f[0] == "STAT" {
			names[f[1]] = f[2]
		}
	}
	return names, lines[len(lines)-1] == "END"
}

func TestStatsSubcommands(t *testing.T) {
	cfg := testConfig(startMemcached(t))
	cfg.MaxConnections = 77
	_, addr := startProxy(t, cfg)
	_, port := hostPort(addr)

	settings, ended := statNames(exchange(t, addr, "stats settings\r\n"))
	if !ended {
		t.Fatalf("stats settings does not end with END: %v", settings)
	}
	for name, want := range map[string]string{
		"maxconns": "77", "tcpport": port, "inter": "127.0.0.1", "item_size_max": "1048576",
		"cas_enabled": "yes", "upstream_selector": upstream.SelectJump, "upstream_timeout_ms": "1000",
	} {
		if got := settings[name]; got != want {
			t.Errorf("stats settings: %s = %q, want %q", name, got, want)
		}
	}

	// The connection asking, and another that sent a command: both are
	// listed, with their addresses.
	asker, other := newLineClient(t, addr), newLineClient(t, addr)
	other.do("version\r\n")
	conns, ended := statNames(asker.do("stats conns\r\n"))
	if !ended {
		t.Fatalf("stats conns does not end with END: %v", conns)
	}
	for _, lc := range []*lineClient{asker, other} {
		n := ""
		for name, v := range conns {
			if strings.HasSuffix(name, ":addr") && v == "tcp:"+lc.c.LocalAddr().String() {
				n = strings.TrimSuffix(name, "addr")
			}
		}
		if n == "" {
			t.Errorf("stats conns does not list %s: %v", lc.c.LocalAddr(), conns)
			continue
		}
		if got := conns[n+"listen_addr"]; got != "tcp:"+addr {
			t.Errorf("%slisten_addr = %q, want tcp:%s", n, got, addr)
		}
		if _, ok := conns[n+"secs_since_last_cmd"]; !ok {
			t.Errorf("no %ssecs_since_last_cmd", n)
		}
	}

	for req, want := range map[string]string{
		"stats slabs\r\n":  "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n",
		"stats items\r\n":  "END\r\n",
		"stats sizes\r\n":  "STAT sizes_status disabled\r\nEND\r\n",
		"stats detail\r\n": "ERROR\r\n",
		"stats nosuch\r\n": "ERROR\r\n",
		"stats reset\r\n":  "RESET\r\n",
	} {
		if got := exchange(t, addr, req); got != want {
			t.Errorf("%q answered %q, want %q", req, got, want)
		}
	}
}
