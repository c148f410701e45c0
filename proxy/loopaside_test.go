package proxy

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestLongRetrievalsOpenedAsideKeepOrder: 100-key gets of raw postings
// lists, which the loop gives to its workers to rebuild, pipelined by four
// clients at once with short gets and misses between them. Every client
// must get its replies whole and in the order it asked, byte for byte what
// it stored, and some of the long ones must have been opened aside.
func TestLongRetrievalsOpenedAsideKeepOrder(t *testing.T) {
	mc := startMemcached(t, "-m", "256")
	cfg := testConfig(mc)
	cfg.Codec = codecConfig()
	cfg.Codec.Postings = true
	cfg.EventLoops = 1
	p, addr := startProxy(t, cfg)

	rng := rand.New(rand.NewPCG(3, 4))
	const keys = 100
	values := make(map[string][]byte, keys)
	var batch []string
	setter := newLineClient(t, addr)
	for i := range keys {
		k := fmt.Sprintf("P2:tenant-aside:01HZ%022d:%d", i, i)
		v := rawPostings(rng, 5000+rng.IntN(4000), 0) // 20-36 KB: 60 need over loopOpenAsideMin
		if r := setter.do("set " + k + " 0 0 " + strconv.Itoa(len(v)) + "\r\n" + string(v) + "\r\n"); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
		values[k] = v
		batch = append(batch, k)
	}
	if r := setter.do("set small 0 0 5\r\nhello\r\n"); r != "STORED\r\n" {
		t.Fatalf("set small: %q", r)
	}
	long := func(ks []string) (req, reply string) {
		var rq, rp bytes.Buffer
		rq.WriteString("get")
		for _, k := range ks {
			rq.WriteString(" " + k)
			fmt.Fprintf(&rp, "VALUE %s 0 %d\r\n%s\r\n", k, len(values[k]), values[k])
		}
		rq.WriteString("\r\n")
		rp.WriteString("END\r\n")
		return rq.String(), rp.String()
	}
	front, frontReply := long(batch[:60])
	back, backReply := long(batch[40:])
	req := front + "get missing\r\nget small\r\n" + back
	want := frontReply + "END\r\nVALUE small 0 5\r\nhello\r\nEND\r\n" + backReply

	const clients, rounds = 4, 8
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, addr)
			got := make([]byte, len(want))
			for r := range rounds {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, req); err != nil {
					errs <- err
					return
				}
				if _, err := io.ReadFull(c, got); err != nil {
					errs <- fmt.Errorf("round %d: %v", r, err)
					return
				}
				if string(got) != want {
					i := 0
					for i < len(got) && got[i] == want[i] {
						i++
					}
					errs <- fmt.Errorf("round %d: replies differ from byte %d of %d: got %.60q, want %.60q", r, i, len(want), got[i:], want[i:])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	p.mu.Lock()
	l := p.loops
	p.mu.Unlock()
	if l == nil {
		t.Fatal("the proxy serves on no event loop")
	}
	n := l.openers.opened.Load()
	t.Logf("%d of %d long gets opened aside", n, 2*clients*rounds)
	if n == 0 {
		t.Error("no long get was opened aside")
	}
}
