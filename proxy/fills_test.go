package proxy

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"mcsidecar/proxy/zones"
)

// Fills and flushes never undo a write: what a read fetched is stored
// again by the sidecar (a zone fill, the local tier) only if no write of
// its key through the sidecar ran meanwhile. Each test puts the race in a
// set order with a relay that holds memcached's bytes back.

// eachPath runs test with a sidecar on loops event loops.
func eachPath(t *testing.T, loops int, test func(t *testing.T, eventLoops int)) {
	t.Run(fmt.Sprintf("EventLoops=%d", loops), func(t *testing.T) { test(t, loops) })
}

// zoneRaceSidecar starts the sidecar of zone a, over zone a's memcached
// and zone b's, with eventLoops. It returns its address, a function that
// reports whether n fills were counted (answered or dropped) within 5 s,
// and one that reads the fills counted with a result.
func zoneRaceSidecar(t *testing.T, eventLoops int, a, b string) (string, func(n int) bool, func(result string) float64) {
	cfg := zonedConfig("a", zoneEntry("a", []string{a}), zoneEntry("b", []string{b}))
	cfg.EventLoops = eventLoops
	cfg.Timeout = 5 * time.Second // the relay holds replies for a while
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	settled := func(n int) bool {
		return waitFor(5*time.Second, func() bool {
			sum := 0.0
			for _, r := range zones.FillResultNames {
				sum += counterWith(t, reg, "mcsidecar_zone_fills_total", "result", r)
			}
			return sum >= float64(n)
		})
	}
	fills := func(result string) float64 {
		return counterWith(t, reg, "mcsidecar_zone_fills_total", "result", result)
	}
	return addr, settled, fills
}

// async sends req on lc in a goroutine and returns where its reply
// comes, or what went wrong.
func async(lc *lineClient, req string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		r, err := tryDo(lc, req)
		if err != nil {
			r = fmt.Sprintf("%q: %v", r, err)
		}
		ch <- r
	}()
	return ch
}

// tryDo sends req, classic or meta, on lc and returns its reply.
func tryDo(lc *lineClient, req string) (string, error) {
	if strings.HasPrefix(req, "m") {
		return metaTry(lc, req)
	}
	lc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(lc.c, req); err != nil {
		return "", err
	}
	return readReply(lc.br)
}

// TestZoneFillAfterADeleteIsDropped: a get (an mg) misses in the local
// zone and finds the key in zone b; before zone b's reply comes, a delete
// of the key (a flush_all) runs through the sidecar, in both zones. The
// fill of what zone b answered must not bring the key back into the local
// zone.
func TestZoneFillAfterADeleteIsDropped(t *testing.T) {
	reads := []struct{ name, req, reply string }{
		{"get", "get %s\r\n", "VALUE %s 0 3\r\nold\r\nEND\r\n"},
		{"mg", "mg %s v\r\n", "VA 3\r\nold\r\n"},
	}
	writes := []struct{ name, req, inB, reply string }{
		// The local zone's reply answers: it never had the key.
		{"delete", "delete %s\r\n", "DELETED", "NOT_FOUND\r\n"},
		{"flush_all", "flush_all\r\n", "OK", "OK\r\n"},
	}
	eachPath(t, 1, func(t *testing.T, eventLoops int) {
		for _, rd := range reads {
			for _, w := range writes {
				t.Run(rd.name+" then "+w.name, func(t *testing.T) {
					a, b := startMemcached(t), startMemcached(t)
					relay := startHoldRelay(t, b)
					sidecar, settled, fills := zoneRaceSidecar(t, eventLoops, a, relay.addr)
					key := rd.name + "-raced-by-" + w.name
					with := func(f string) string { return strings.ReplaceAll(f, "%s", key) }
					directSet(t, b, key, 0, 0, "old")
					reader, writer := newLineClient(t, sidecar), newLineClient(t, sidecar)

					relay.holdReplies()
					got := async(reader, with(rd.req))
					if !relay.waitHeld("VA ", false) {
						t.Fatal("zone b's hit never came")
					}
					wrote := async(writer, with(w.req))
					if !relay.waitHeld(w.inB, false) {
						t.Fatalf("%s never reached zone b", w.name)
					}
					relay.release("")
					if r := <-got; r != with(rd.reply) {
						t.Fatalf("%s: %q", rd.name, r)
					}
					if r := <-wrote; r != w.reply {
						t.Fatalf("%s: %q", w.name, r)
					}
					// The fill, if any, is sent after the read's reply:
					// wait for it to be answered (or dropped), then look
					// in the local zone.
					if !settled(1) {
						t.Fatal("no fill was counted")
					}
					if _, d, ok := inZone(t, []string{a}, key); ok {
						t.Fatalf("the key that %s dropped is back in the local zone: %q", w.name, d)
					}
					if r := reader.do("get " + key + "\r\n"); r != "END\r\n" {
						t.Fatalf("get after %s: %q", w.name, r)
					}
					if n := fills("dropped"); n != 1 {
						t.Errorf("fills dropped: %v, want 1", n)
					}
				})
			}
		}
	})
}

// TestZoneFillOvertakenByADeleteIsUndone: a get (an mg) finds the key in
// zone b only, and its fill goes to the local zone; before the fill gets
// there, a delete of the key runs through the sidecar on another
// connection and reaches the local zone first. The fill then stores the
// old value: it must be deleted again. On an event loop a get's fill and
// the delete go out on one connection, in order, unless the clients are
// on two loops.
func TestZoneFillOvertakenByADeleteIsUndone(t *testing.T) {
	reads := []struct{ name, req, reply, fill string }{
		{"get", "get %s\r\n", "VALUE %s 0 3\r\nold\r\nEND\r\n", "add %s "},
		{"mg", "mg %s v\r\n", "VA 3\r\nold\r\n", "ms %s "},
	}
	eachPath(t, 2, func(t *testing.T, eventLoops int) {
		for _, rd := range reads {
			t.Run(rd.name, func(t *testing.T) {
				a, b := startMemcached(t), startMemcached(t)
				relay := startHoldRelay(t, a)
				sidecar, settled, fills := zoneRaceSidecar(t, eventLoops, relay.addr, b)
				key := rd.name + "-overtaken-by-a-delete"
				with := func(f string) string { return strings.ReplaceAll(f, "%s", key) }
				directSet(t, b, key, 0, 0, "old")
				// Two loops take connections in turn.
				reader, writer := newLineClient(t, sidecar), newLineClient(t, sidecar)

				relay.holdRequests(with(rd.fill))
				if r := <-async(reader, with(rd.req)); r != with(rd.reply) {
					t.Fatalf("%s: %q", rd.name, r)
				}
				if !relay.waitHeld(with(rd.fill), true) {
					t.Fatal("the fill never came")
				}
				select {
				case r := <-async(writer, "delete "+key+"\r\n"):
					if r != "NOT_FOUND\r\n" {
						t.Fatalf("delete: %q", r)
					}
				case <-time.After(2 * time.Second): // within the upstream timeout
					t.Fatal("the delete waited for the fill held back: it went out on the fill's connection")
				}
				relay.release(with(rd.fill))
				if !settled(1) {
					t.Fatal("no fill was counted")
				}
				if !waitFor(5*time.Second, func() bool { _, _, ok := inZone(t, []string{a}, key); return !ok }) {
					_, d, _ := inZone(t, []string{a}, key)
					t.Fatalf("the key deleted through the sidecar is back in the local zone: %q", d)
				}
				if r := writer.do("get " + key + "\r\n"); r != "END\r\n" {
					t.Fatalf("get after the delete: %q", r)
				}
				if n := fills("dropped"); n != 1 {
					t.Errorf("fills dropped: %v, want 1", n)
				}
			})
		}
	})
}

// TestLocalTierKeepsNothingReadBeforeAWrite: a get of an immutable key
// is read from memcached before a flush_all (a delayed one, a delete) runs
// through the sidecar, and its reply comes only once that write is
// answered. The tier must not keep what it read: memcached dropped it.
func TestLocalTierKeepsNothingReadBeforeAWrite(t *testing.T) {
	writes := []struct {
		name, req, reply string
		delayed          bool // memcached acts on it later
	}{
		{"flush_all", "flush_all\r\n", "OK\r\n", false},
		{"flush_all 2", "flush_all 2\r\n", "OK\r\n", true},
		{"delete", "", "DELETED\r\n", false},
	}
	eachPath(t, 1, func(t *testing.T, eventLoops int) {
		for i, w := range writes {
			t.Run(w.name, func(t *testing.T) {
				up := startMemcached(t)
				relay := startHoldRelay(t, up)
				cfg := tierConfig(tierTestSize, relay.addr)
				cfg.EventLoops = eventLoops
				cfg.Timeout = 5 * time.Second // the relay holds replies for a while
				_, sidecar := startProxy(t, cfg)
				key := tierKey(fmt.Sprintf("read-before-a-write-%d", i))
				reader, writer := newLineClient(t, sidecar), newLineClient(t, sidecar)
				if r := writer.do(setReq("set", key, "old")); r != "STORED\r\n" {
					t.Fatalf("set: %q", r)
				}
				req := w.req
				if req == "" {
					req = "delete " + key + "\r\n"
				}

				relay.holdReplies()
				got := async(reader, "get "+key+"\r\n")
				if !relay.waitHeld("VA ", false) {
					t.Fatal("memcached's hit never came")
				}
				wrote := async(writer, req)
				if !relay.waitHeld(w.reply, false) {
					t.Fatalf("%s never reached memcached", w.name)
				}
				// The write is answered first, then the get. (On an event
				// loop a delete goes out on the get's connection, behind
				// it: both are answered at once, in order.)
				relay.release(w.reply)
				if r := <-wrote; r != w.reply {
					t.Fatalf("%s: %q", w.name, r)
				}
				relay.release("")
				if r := <-got; r != valueReply(key, 0, "old") {
					t.Fatalf("get: %q", r)
				}
				if w.delayed {
					// memcached's clock counts whole seconds: it drops
					// the item up to two seconds after the flush_all.
					direct := newLineClient(t, up)
					if !waitFor(4*time.Second, func() bool { _, _, ok := rawItem(t, direct, key); return !ok }) {
						t.Fatal("memcached still holds the item 4s after flush_all 2")
					}
				}
				for range 2 { // the second would come from the tier
					if r := reader.do("get " + key + "\r\n"); r != "END\r\n" {
						t.Fatalf("get after %s: %q", w.name, short(r))
					}
				}
			})
		}
	})
}
