package proxy

import (
	"fmt"
	"io"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metaDo sends one meta request through lc and returns its reply: the
// line, and the data block a VA line announces.
func metaDo(t *testing.T, lc *lineClient, req string) string {
	t.Helper()
	reply, err := metaTry(lc, req)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	return reply
}

// metaTry is metaDo for goroutines other than the test's: it returns the
// error instead of ending the test.
func metaTry(lc *lineClient, req string) (string, error) {
	lc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(lc.c, req); err != nil {
		return "", err
	}
	line, err := lc.br.ReadString('\n')
	if err != nil {
		return line, err
	}
	if rest, ok := strings.CutPrefix(line, "VA "); ok {
		size, _, _ := strings.Cut(strings.TrimSuffix(rest, "\r\n"), " ")
		n, err := strconv.Atoi(size)
		if err != nil {
			return line, fmt.Errorf("bad VA line %q", line)
		}
		block := make([]byte, n+2)
		if _, err := io.ReadFull(lc.br, block); err != nil {
			return line, err
		}
		line += string(block)
	}
	return line, nil
}

// TestMetaZones checks that the meta commands keep two zones in line as
// the classic commands do: ms sets and md deletes reach every zone, mg
// finds in another zone what the local one lacks, an ms add stores only
// where no zone holds the key, and append mode and ma change the deciding
// zone's copy and drop the others — with values plain and enveloped.
func TestMetaZones(t *testing.T) {
	for _, enveloped := range []bool{false, true} {
		name := "plain"
		if enveloped {
			name = "enveloped"
		}
		t.Run(name, func(t *testing.T) {
			a, b := startZone(t, 2), startZone(t, 2)
			entries := []string{zoneEntry("a", a), zoneEntry("b", b)}
			config := func(local string) Config {
				cfg := zonedConfig(local, entries...)
				if enveloped {
					cfg.Codec = codecConfig()
					cfg.EnvelopeAll = true
				}
				return cfg
			}
			_, addrA := startProxy(t, config("a"))
			_, addrB := startProxy(t, config("b"))
			viaA, viaB := newLineClient(t, addrA), newLineClient(t, addrB)
			held := func(z []string, key string) bool {
				_, _, ok := inZone(t, z, key)
				return ok
			}
			expect := func(lc *lineClient, req, want string) {
				t.Helper()
				if got := metaDo(t, lc, req); got != want {
					t.Fatalf("%q answered %q, want %q", req, got, want)
				}
			}

			expect(viaA, "ms k1 3 F5\r\none\r\n", "HD\r\n")
			if !held(a, "k1") || !held(b, "k1") {
				t.Errorf("ms set did not reach both zones")
			}
			expect(viaB, "mg k1 v f k\r\n", "VA 3 f5 kk1\r\none\r\n")
			expect(viaA, "md k1 q\r\nmn\r\n", "MN\r\n")
			if held(a, "k1") || held(b, "k1") {
				t.Errorf("md did not reach both zones")
			}

			// Only zone b holds k2: a's sidecar finds it there.
			directSet(t, ownerOf(t, b, "k2"), "k2", 0, 0, "two")
			expect(viaA, "mg k2 v s O7\r\n", "VA 3 s3 O7\r\ntwo\r\n")
			if !waitFor(2*time.Second, func() bool { return held(a, "k2") }) {
				t.Errorf("mg did not fill zone a from zone b")
			}

			// N creates the item only where no zone has it, so one
			// client wins the recache, whichever sidecar it asks.
			directSet(t, ownerOf(t, b, "k5"), "k5", 0, 0, "five")
			expect(viaA, "mg k5 N30 v\r\n", "VA 4\r\nfive\r\n")
			expect(viaA, "mg k6 N30 v s\r\n", "VA 0 s0 W\r\n\r\n")
			expect(viaB, "mg k6 N30 v s\r\n", "VA 0 s0 Z\r\n\r\n")

			expect(viaA, "ms k3 5 ME\r\nfirst\r\n", "HD\r\n")
			expect(viaB, "ms k3 6 ME\r\nsecond\r\n", "NS\r\n")
			expect(viaA, "mg k3 v\r\n", "VA 5\r\nfirst\r\n")
			expect(viaB, "mg k3 v\r\n", "VA 5\r\nfirst\r\n")

			expect(viaA, "ms k4 1\r\nx\r\n", "HD\r\n")
			expect(viaA, "ms k4 1 MA\r\ny\r\n", "HD\r\n")
			if held(b, "k4") {
				t.Errorf("append mode left zone b's copy")
			}
			expect(viaB, "mg k4 v\r\n", "VA 2\r\nxy\r\n")

			expect(viaA, "ms n 2\r\n10\r\n", "HD\r\n")
			expect(viaA, "ma n D5 v\r\n", "VA 2\r\n15\r\n")
			if held(b, "n") {
				t.Errorf("ma left zone b's copy")
			}
			// Zone b lacks the copy: zone a decides b's sidecar's ma.
			expect(viaB, "ma n v\r\n", "VA 2\r\n16\r\n")
			expect(viaB, "ma none\r\n", "NF\r\n")
		})
	}
}

// TestMetaConcurrentEnvelopedUpdatesLoseNothing runs ma and append-mode ms
// on enveloped items from several connections at once: every update that
// was answered HD must be in the final value, as with memcached's own
// atomic ones.
func TestMetaConcurrentEnvelopedUpdatesLoseNothing(t *testing.T) {
	_, addr := startProxy(t, envelopeAllConfig(startMemcached(t)))
	setup := newLineClient(t, addr)
	metaDo(t, setup, "ms n 1\r\n0\r\n")
	metaDo(t, setup, "ms log 0\r\n\r\n")
	const workers, each = 4, 40
	done := make(chan [2]int)
	for range workers {
		go func() {
			lc := newLineClient(t, addr)
			var ok [2]int
			for range each {
				if r, err := metaTry(lc, "ma n\r\n"); r == "HD\r\n" {
					ok[0]++
				} else if err != nil || !strings.HasPrefix(r, "SERVER_ERROR") {
					t.Errorf("ma: %q %v", r, err)
				}
				if r, err := metaTry(lc, "ms log 1 MA\r\n+\r\n"); r == "HD\r\n" {
					ok[1]++
				} else if err != nil || !strings.HasPrefix(r, "SERVER_ERROR") {
					t.Errorf("ms append: %q %v", r, err)
				}
			}
			done <- ok
		}()
	}
	var total [2]int
	for range workers {
		ok := <-done
		total[0] += ok[0]
		total[1] += ok[1]
	}
	n := strconv.Itoa(total[0])
	if r := metaDo(t, setup, "mg n v\r\n"); r != "VA "+strconv.Itoa(len(n))+"\r\n"+n+"\r\n" {
		t.Errorf("after %d ma: %q", total[0], r)
	}
	if r := metaDo(t, setup, "mg log s\r\n"); r != "HD s"+strconv.Itoa(total[1])+"\r\n" {
		t.Errorf("after %d appends: %q", total[1], r)
	}
	t.Logf("%d of %d ma and %d of %d appends took", total[0], workers*each, total[1], workers*each)
}

// TestMetaLongKeys runs the meta commands on keys over 250 bytes with key
// settings on: rewritten upstream, their values bound to the client key,
// and the client's own key in every reply.
func TestMetaLongKeys(t *testing.T) {
	_, addr := startProxy(t, keyspaceConfig(startMemcached(t)))
	lc := newLineClient(t, addr)
	long, counter := strings.Repeat("k", 300), strings.Repeat("c", 300)
	for _, step := range []struct{ req, want string }{
		{"ms " + long + " 2 F3 T0 k\r\nhi\r\n", "HD k" + long + "\r\n"},
		{"mg " + long + " v f s k\r\n", "VA 2 f3 s2 k" + long + "\r\nhi\r\n"},
		{"ms " + long + " 1 MA\r\n!\r\n", "HD\r\n"},
		{"mg " + long + " v f\r\n", "VA 3 f3\r\nhi!\r\n"},
		{"ma " + counter + " N0 J5 v k\r\n", "VA 1 k" + counter + "\r\n5\r\n"},
		{"ma " + counter + " D10 v\r\n", "VA 2\r\n15\r\n"},
		{"mg " + counter + " N30 v\r\n", "VA 2\r\n15\r\n"},
		{"md " + long + " k\r\n", "HD k" + long + "\r\n"},
		{"mg " + long + " v k\r\n", "EN k" + long + "\r\n"},
		{"mg " + long + " N30 v s\r\n", "VA 0 s0 W\r\n\r\n"},
	} {
		if got := metaDo(t, lc, step.req); got != step.want {
			t.Fatalf("%q answered %q, want %q", short(step.req), short(got), short(step.want))
		}
	}
	if got := metaDo(t, lc, "me "+counter+"\r\n"); !strings.HasPrefix(got, "ME "+counter+" exp=-1 ") {
		t.Errorf("me answered %q", short(got))
	}
}

// TestMetaGetUpstreamFailureIsAMiss: with its server down, mg answers EN
// (the default retrieval failure policy) and counts an upstream error.
func TestMetaGetUpstreamFailureIsAMiss(t *testing.T) {
	cfg := testConfig(deadUpstream(t))
	cfg.ConnectTimeout = 100 * time.Millisecond
	p, addr := startProxy(t, cfg)
	if got := metaDo(t, newLineClient(t, addr), "mg k v O1 k\r\n"); got != "EN O1 kk\r\n" {
		t.Fatalf("mg answered %q", got)
	}
	if n := p.stats.Requests[wire.CmdMetaGet][stats.OutcomeUpstreamError].Load(); n != 1 {
		t.Errorf("%d mg upstream errors counted, want 1", n)
	}
}

// TestClassicWriteAfterMetaKeepsZonesInLine runs classic writes on the
// slot a meta command was just answered on (one client, one loop: each
// command takes the slot the one before gave back). A slot keeps a meta
// request for the next meta command, and a classic write once took it for
// its own: a replace brought the other zone in line with the last ms's
// request, setting that key to its old value, and an add that another
// zone refused deleted the last ms's key instead of its own copy.
func TestClassicWriteAfterMetaKeepsZonesInLine(t *testing.T) {
	a, b := startZone(t, 1), startZone(t, 1)
	cfg := zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b))
	cfg.EventLoops = 1
	_, addr := startProxy(t, cfg)
	lc := newLineClient(t, addr)
	expect := func(req, want string) {
		t.Helper()
		if got := metaDo(t, lc, req); got != want {
			t.Fatalf("%q answered %q, want %q", req, got, want)
		}
	}
	item := func(z []string, key string) string {
		t.Helper()
		_, data, ok := inZone(t, z, key)
		if !ok {
			return "(none)"
		}
		return data
	}

	// A replace after an ms in replace mode.
	expect("set k 0 0 1\r\nv\r\n", "STORED\r\n")
	expect("set m 0 0 3\r\nold\r\n", "STORED\r\n")
	expect("ms m 3 MR\r\nnew\r\n", "HD\r\n")
	expect("set m 0 0 5\r\nnewer\r\n", "STORED\r\n")
	expect("replace k 0 0 2\r\nv2\r\n", "STORED\r\n")
	for _, z := range [][]string{a, b} {
		if got := item(z, "k"); got != "v2" {
			t.Errorf("after the replace, %s holds k = %q, want v2", z[0], got)
		}
		if got := item(z, "m"); got != "newer" {
			t.Errorf("after the replace, %s holds m = %q, want newer", z[0], got)
		}
	}

	// An add of a key only zone b holds, after an ms in add mode.
	directSet(t, b[0], "j", 0, 0, "b's")
	expect("ms x 1 ME\r\n1\r\n", "HD\r\n")
	expect("add j 0 0 1\r\na\r\n", "NOT_STORED\r\n")
	if got := item(a, "j"); got != "(none)" {
		t.Errorf("the add left its copy in zone a: j = %q", got)
	}
	if got := item(a, "x"); got != "1" {
		t.Errorf("after the add, zone a holds x = %q, want 1", got)
	}
	if got := item(b, "j"); got != "b's" {
		t.Errorf("after the add, zone b holds j = %q, want b's", got)
	}
}
