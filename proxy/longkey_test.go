package proxy

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// federatedKey is a query-frontend results key of a federated query over
// 130 tenants of 150 bytes each, joined by '|': about 20 KB.
func federatedKey() string {
	ts := make([]string, 130)
	for i := range ts {
		ts[i] = testTenant(fmt.Sprintf("t%03d", i), 150)
	}
	return "1@QS:" + strings.Join(ts, "|") + ":" + testHash43 + ":60000:1700000000000"
}

// pieceWriter sends each request in several writes, apart in time, so
// that its line arrives in pieces: the key cut in the middle, the line's
// end apart from its data block.
type pieceWriter struct {
	c      net.Conn
	pieces int
}

func (w pieceWriter) Write(b []byte) (int, error) {
	step := max(len(b)/w.pieces, 1)
	for i := 0; i < len(b); i += step {
		if _, err := w.c.Write(b[i:min(i+step, len(b))]); err != nil {
			return i, err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return len(b), nil
}

// TestFederatedKeyWorksForEveryCommand sends a 20 KB federated results
// key, with the default key settings, through every command that names
// a key, each request whole and in pieces: each answers as memcached
// answers the same commands for a short key.
func TestFederatedKeyWorksForEveryCommand(t *testing.T) {
	key := federatedKey()
	if len(key) < 19_000 {
		t.Fatalf("the federated key is %d bytes", len(key))
	}
	steps := []struct{ req, want string }{
		{"set K 5 0 2\r\nhi\r\n", "STORED\r\n"},
		{"get K\r\n", "VALUE K 5 2\r\nhi\r\nEND\r\n"},
		{"append K 0 0 1\r\n!\r\n", "STORED\r\n"},
		{"gets K\r\n", "VALUE K 5 3 CAS\r\nhi!\r\nEND\r\n"},
		{"touch K 100\r\n", "TOUCHED\r\n"},
		{"gat 100 K\r\n", "VALUE K 5 3\r\nhi!\r\nEND\r\n"},
		{"mg K v f\r\n", "VA 3 f5\r\nhi!\r\n"},
		{"ms K 2 T0\r\nok\r\n", "HD\r\n"},
		{"mg K v\r\n", "VA 2\r\nok\r\n"},
		{"delete K\r\n", "DELETED\r\n"},
		{"get K\r\n", "END\r\n"},
		{"set K 0 0 1\r\n7\r\n", "STORED\r\n"},
		{"incr K 5\r\n", "12\r\n"},
		{"ma K v\r\n", "VA 2\r\n13\r\n"},
		{"md K\r\n", "HD\r\n"},
		{"mg K v\r\n", "EN\r\n"},
	}
	for _, pieces := range []int{1, 7} {
		t.Run(fmt.Sprintf("%d pieces", pieces), func(t *testing.T) {
			up := startMemcached(t)
			_, addr := startProxy(t, keyspaceConfig(up))
			lc := newLineClient(t, addr)
			direct := newLineClient(t, up)
			w := pieceWriter{c: lc.c, pieces: pieces}
			for i, s := range steps {
				req := strings.ReplaceAll(s.req, "K", key)
				if _, err := io.WriteString(w, req); err != nil {
					t.Fatal(err)
				}
				lc.c.SetDeadline(time.Now().Add(10 * time.Second))
				got, err := readReply(lc.br)
				if err != nil {
					t.Fatalf("step %d %.30q: %v (read %.80q)", i, s.req, err, got)
				}
				want := strings.ReplaceAll(s.want, "K", key)
				got = casValue.ReplaceAllString(got, "$1 CAS\r")
				if got != want {
					t.Fatalf("step %d %.30q: %.80q, want %.80q", i, s.req, got, want)
				}
			}
			// What memcached holds is under a key it takes.
			if got := direct.do("stats\r\n"); !strings.Contains(got, "STAT cmd_set ") {
				t.Fatalf("memcached's stats: %.80q", got)
			}
		})
	}
}

// TestBinaryMetaKeysAnswerAsMemcached sends meta commands with base64
// keys (flag b) whose bytes are binary, spaces and line ends included,
// to memcached and through the proxy with the default key settings: the
// replies are the same. A key of 300 binary bytes, which memcached
// refuses, round-trips through the proxy, rewritten.
func TestBinaryMetaKeysAnswerAsMemcached(t *testing.T) {
	// memcached, and another one behind the proxy: the commands change
	// what they hold.
	direct := newLineClient(t, startMemcached(t))
	_, addr := startProxy(t, keyspaceConfig(startMemcached(t)))
	lc := newLineClient(t, addr)
	all := make([]byte, 180)
	for i := range all {
		all[i] = byte(i * 7)
	}
	for _, raw := range []string{"bin\x00key\x01", "sp ace\r\nx", string(all), strings.Repeat("\xff", 100)} {
		k := base64.StdEncoding.EncodeToString([]byte(raw))
		for _, req := range []string{
			"ms " + k + " 3 b F9\r\nabc\r\n",
			"mg " + k + " b v k f\r\n",
			"mg " + k + " v\r\n",
			"ma " + k + " b\r\n",
			"ms " + k + " 1 b\r\n5\r\n",
			"ma " + k + " b v D3\r\n",
			"md " + k + " b\r\n",
			"mg " + k + " b v\r\n",
		} {
			want, got := doMeta(t, direct, req), doMeta(t, lc, req)
			if got != want {
				t.Fatalf("%.40q: the proxy answered %q, memcached %q", req, got, want)
			}
		}
	}

	long := make([]byte, 300)
	for i := range long {
		long[i] = byte(i)
	}
	k := base64.StdEncoding.EncodeToString(long)
	if got := doMeta(t, direct, "mg "+k+" b v\r\n"); !strings.HasPrefix(got, "CLIENT_ERROR") {
		t.Fatalf("memcached answered a 300-byte binary key: %q", got)
	}
	for _, s := range []struct{ req, want string }{
		{"ms " + k + " 2 b\r\nhi\r\n", "HD\r\n"},
		{"mg " + k + " b v k\r\n", "VA 2 k" + k + " b\r\nhi\r\n"},
		{"md " + k + " b\r\n", "HD\r\n"},
		{"mg " + k + " b v\r\n", "EN\r\n"},
	} {
		if got := doMeta(t, lc, s.req); got != s.want {
			t.Fatalf("%.40q: %q, want %q", s.req, got, s.want)
		}
	}
}

// doMeta sends req and reads its reply, a meta command's value block
// included.
func doMeta(t *testing.T, lc *lineClient, req string) string {
	t.Helper()
	lc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(lc.c, req); err != nil {
		t.Fatal(err)
	}
	got, err := readReply(lc.br)
	if err != nil {
		t.Fatalf("%.40q: %v (read %q)", req, err, got)
	}
	return got
}
