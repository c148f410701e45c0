package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"mcsidecar/proxy/memcachedtest"
)

// runLoadgen runs loadgen with args and returns its result line, whether
// it judged the server right, and what it said on stderr.
func runLoadgen(t *testing.T, args ...string) (result string, ok bool, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	ok, err := run(args, &out, &errs)
	if err != nil {
		t.Fatalf("loadgen %v: %v (stderr %q)", args, err, errs.String())
	}
	return out.String(), ok, errs.String()
}

// field returns the value of name=value field k of loadgen's result line.
func field(t *testing.T, line, k string) int {
	t.Helper()
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, k+"="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s=%q in %q", k, v, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", k, line)
	return 0
}

// TestAgainstMemcached runs every load shape of the comparison, on event
// loops and on goroutines, against a real memcached: every value read
// must check out, and the requests asked for must all be made.
func TestAgainstMemcached(t *testing.T) {
	addr := memcachedtest.Start(t)
	for _, loops := range []string{"-1", "2", "0"} {
		for _, shape := range [][]string{
			{"--multiget", "1", "--get-ratio", "0.9"},
			{"--multiget", "10", "--get-ratio", "0.9"},
			{"--multiget", "100", "--value-size", "3072", "--conns", "8"},
			{"--multiget", "1", "--get-ratio", "0.5", "--value-size", "200000", "--keys", "40"},
		} {
			args := append([]string{"--addr", addr, "--requests", "3000", "--keys", "500", "--event-loops", loops}, shape...)
			line, ok, stderr := runLoadgen(t, args...)
			if !ok || field(t, line, "wrong") != 0 || field(t, line, "errors") != 0 {
				t.Fatalf("%v: %s%s", args, line, stderr)
			}
			if got := field(t, line, "requests"); got != 3000 {
				t.Errorf("%v: %d requests, want 3000", args, got)
			}
			if field(t, line, "gets") == 0 || field(t, line, "sets") == 0 || field(t, line, "misses") != 0 {
				t.Errorf("%v: %s", args, line)
			}
		}
	}
}

// TestFindsWrongValues has a server that serves one byte of one value
// wrong, now and then, among good replies: loadgen must count them.
func TestFindsWrongValues(t *testing.T) {
	mc := memcachedtest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go corruptingRelay(c, mc)
		}
	}()
	for _, loops := range []string{"-1", "0"} {
		line, ok, _ := runLoadgen(t, "--addr", ln.Addr().String(), "--requests", "2000", "--keys", "200", "--conns", "4", "--get-ratio", "0.9", "--event-loops", loops)
		if ok || field(t, line, "wrong") == 0 {
			t.Errorf("--event-loops %s: a corrupted value went unnoticed: %s", loops, line)
		}
	}
}

// corruptingRelay passes c's requests to memcached at mc and its replies
// back, flipping a byte in every 50th value (past its header).
func corruptingRelay(c net.Conn, mc string) {
	defer c.Close()
	up, err := net.Dial("tcp", mc)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				up.Close()
				return
			}
			up.Write(buf[:n])
		}
	}()
	rd := bufio.NewReader(up)
	values := 0
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return
		}
		if !bytes.HasPrefix(line, []byte("VALUE ")) {
			c.Write(line)
			continue
		}
		var key string
		var flags, size int
		if _, err := fmt.Sscanf(string(line), "VALUE %s %d %d", &key, &flags, &size); err != nil {
			return
		}
		data := make([]byte, size+2)
		if _, err := io.ReadFull(rd, data); err != nil {
			return
		}
		if values++; values%50 == 0 {
			data[size-1] ^= 0x20
		}
		c.Write(append(line, data...))
	}
}

// TestReplyScan feeds replies to replyScan a byte at a time and in one
// piece: it must find each one's end exactly, and no sooner.
func TestReplyScan(t *testing.T) {
	value := bytes.Repeat([]byte("a\r\nEND\r\n"), 40)
	for _, tc := range []struct {
		reply string
		get   bool
	}{
		{"STORED\r\n", false},
		{"SERVER_ERROR out of memory\r\n", false},
		{"END\r\n", true},
		{"VALUE k 0 3\r\nEND\r\nEND\r\n", true},
		{"VALUE k 1 320\r\n" + string(value) + "\r\nVALUE j 2 0\r\n\r\nEND\r\n", true},
		{"CLIENT_ERROR bad data chunk\r\n", true},
		{"VALUE k 0 x\r\n", true}, // broken framing ends the reply at once
	} {
		whole := []byte(tc.reply + "STORED\r\n") // what follows is not part of it
		var r replyScan
		r.get = tc.get
		for i := 0; i <= len(whole); i++ {
			got := r.end(whole[:i])
			want := 0
			if i >= len(tc.reply) {
				want = len(tc.reply)
			}
			if got != want {
				t.Fatalf("%q: after %d bytes: end %d, want %d", tc.reply, i, got, want)
			}
			if got > 0 {
				break
			}
		}
		r = replyScan{get: tc.get}
		if got := r.end(whole); got != len(tc.reply) {
			t.Errorf("%q in one piece: end %d, want %d", tc.reply, got, len(tc.reply))
		}
	}
}

// TestIsValue: isValue accepts exactly what appendValue writes.
func TestIsValue(t *testing.T) {
	for _, size := range []int{51, 64, 1024, 3077} {
		cfg := &config{valueSize: size, seed: 7, keyPrefix: "lg:", pad: newPad(7, size)}
		v := appendValue(nil, cfg, 42, 3)
		if !isValue(v, cfg, 42, 3) {
			t.Fatalf("size %d: its own value rejected", size)
		}
		if isValue(v, cfg, 42, 4) || isValue(v, cfg, 43, 3) || isValue(v[:size-1], cfg, 42, 3) {
			t.Errorf("size %d: accepted for another key, version or length", size)
		}
		for i := range v {
			v[i] ^= 1
			if isValue(v, cfg, 42, 3) {
				t.Fatalf("size %d: byte %d flipped, still accepted", size, i)
			}
			v[i] ^= 1
		}
	}
}

// TestLoopTimesOut has a server that answers the pre-population and then
// nothing: the connection on the event loop must give up after --timeout
// and loadgen end, judging the server wrong.
func TestLoopTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		for answered := 0; ; answered++ {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			var key string
			var flags, exp, size int
			if _, err := fmt.Sscanf(line, "set %s %d %d %d", &key, &flags, &exp, &size); err == nil {
				if _, err := io.ReadFull(rd, make([]byte, size+2)); err != nil {
					return
				}
			}
			if answered < 4 { // the four keys of the pre-population
				c.Write([]byte("STORED\r\n"))
			}
		}
	}()
	start := time.Now()
	line, ok, stderr := runLoadgen(t, "--addr", ln.Addr().String(), "--conns", "1", "--keys", "4", "--duration", "30s", "--timeout", "300ms")
	if ok || field(t, line, "errors") != 1 || !strings.Contains(stderr, errReplyTimeout.Error()) {
		t.Errorf("a silent server: %s%s", line, stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("loadgen took %v to give up on a silent server", took)
	}
}
