package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"mcsidecar/proxy/evloop"
)

// TestHeavyClientsSpreadOverTheLoops: with --event-loops -1 every client
// begins on the first loop; four that read 100 values of 3 KB a request
// leave it between requests, spread evenly over the other loops, four
// that read one value stay, and every reply is right all along. When the
// four go on to read one value a request, they go back to the first loop.
func TestHeavyClientsSpreadOverTheLoops(t *testing.T) {
	switch {
	case loopMoveAlways.Load():
		t.Skip("every client moves all the time")
	case evloop.Poller != "epoll":
		t.Skip("the portable poller moves no connection")
	}
	mc := startMemcached(t)
	cfg := testConfig(mc)
	cfg.EventLoops = EventLoopsAuto
	p, addr := startProxy(t, cfg)

	const keys = 100
	value := func(i int) string { return fmt.Sprintf("%04d", i) + strings.Repeat("v", 3<<10) }
	setter := newLineClient(t, addr)
	var all, want strings.Builder
	all.WriteString("get")
	for i := range keys {
		v := value(i)
		if got := setter.do(fmt.Sprintf("set k%d 0 0 %d\r\n%s\r\n", i, len(v), v)); got != "STORED\r\n" {
			t.Fatalf("set: %q", got)
		}
		fmt.Fprintf(&all, " k%d", i)
		fmt.Fprintf(&want, "VALUE k%d 0 %d\r\n%s\r\n", i, len(v), v)
	}
	all.WriteString("\r\n")
	want.WriteString("END\r\n")

	// getOne has each client get one value, a different key each.
	getOne := func(clients []*lineClient, round int, who string) {
		t.Helper()
		for i, c := range clients {
			k := (round*4 + i) % keys
			v := value(k)
			if got, want := c.do(fmt.Sprintf("get k%d\r\n", k)), fmt.Sprintf("VALUE k%d 0 %d\r\n%s\r\nEND\r\n", k, len(v), v); got != want {
				t.Fatalf("round %d, %s %d: %q", round, who, i, short(got))
			}
		}
	}
	var heavy, light []*lineClient
	for range 4 {
		heavy = append(heavy, newLineClient(t, addr))
		light = append(light, newLineClient(t, addr))
	}
	for round := range 40 {
		for i, c := range heavy {
			if got := c.do(all.String()); got != want.String() {
				t.Fatalf("round %d, heavy client %d: %d bytes, want %d", round, i, len(got), want.Len())
			}
		}
		getOne(light, round, "light client")
	}

	if moves := p.stats.ClientMoves.Load(); moves != 4 {
		t.Errorf("%d clients moved, want 4", moves)
	}
	var counts []int32
	for _, el := range p.loops.cli.Loops() {
		counts = append(counts, p.loops.state(el).heavy.Load())
	}
	sum := 0
	for _, n := range counts {
		sum += int(n)
	}
	if spread := slices.Max(counts[1:]) - slices.Min(counts[1:]); counts[0] != 0 || sum != 4 || spread > 1 {
		t.Errorf("heavy clients by loop %v, want none on the first and the rest even", counts)
	}

	// A mean of 300 KB falls under 32 KB after 17 replies of 3 KB.
	for round := range 30 {
		getOne(heavy, round, "formerly heavy client")
	}
	if !waitFor(5*time.Second, func() bool { return p.stats.ClientMoves.Load() == 8 }) {
		t.Errorf("%d clients moved, want 8: each heavy one back to the first loop", p.stats.ClientMoves.Load())
	}
	if onLoop(t, p, func(lc *loopClient) bool { return lc.ls.heavyOnly || lc.heavy }) {
		t.Error("a client turned light stayed on a loop of heavy clients")
	}
}
