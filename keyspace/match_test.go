package keyspace

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
)

// matchKeyspaces are key settings a Match is checked under: the defaults,
// short upstream keys with user schemes (as FuzzRewrite), and user schemes
// marked +postings and +immutable ahead of the built-in ones.
func matchKeyspaces(t testing.TB) []*Keyspace {
	return []*Keyspace{
		newKeyspace(t, nil),
		newKeyspace(t, func(c *Config) {
			c.MaxLength = 64
			c.Schemes = []string{"u=P2:{tenant}:{ulid}:{2}:{1}", "v={}|{tenants}/{3}:{2}:{1}"}
		}),
		newKeyspace(t, func(c *Config) {
			c.Schemes = []string{"mine+postings+immutable=P2:{tenant}:{}", "loki-index=IDX:{tenant}:{ulid}:{1}"}
		}),
	}
}

// checkMatch fails t unless one Match of key gives the answers the
// separate calls give: tenant, scheme, immutability and upstream key. The
// rewrite is asked first, so that what it notes in the match is seen to
// change none of the other answers.
func checkMatch(t testing.TB, k *Keyspace, key []byte) {
	t.Helper()
	m := k.Match(key)
	checkAnswers(t, k, key, &m)
}

// checkAnswers is checkMatch for a Match m already made of key.
func checkAnswers(t testing.TB, k *Keyspace, key []byte, m *Match) {
	t.Helper()
	out, step, scheme := m.AppendRewrite(nil)
	wantOut, wantStep, wantScheme := k.AppendRewrite(nil, key)
	if !bytes.Equal(out, wantOut) || step != wantStep || scheme != wantScheme {
		t.Fatalf("%q: match rewrites to %q (%v, %q), AppendRewrite to %q (%v, %q)", key, out, step, scheme, wantOut, wantStep, wantScheme)
	}
	if wantStep != StepNone {
		if again, step, scheme := m.Rewrite(nil); !bytes.Equal(again, wantOut) || step != wantStep || scheme != wantScheme {
			t.Fatalf("%q: Rewrite gives %q (%v, %q), AppendRewrite %q (%v, %q)", key, again, step, scheme, wantOut, wantStep, wantScheme)
		}
	}
	tenant, wantTenant := m.Tenant(), k.Tenant(key)
	if !bytes.Equal(tenant, wantTenant) || (tenant == nil) != (wantTenant == nil) || cap(tenant) != cap(wantTenant) {
		t.Fatalf("%q: match says tenant %q, Tenant %q", key, tenant, wantTenant)
	}
	s, ok := m.Scheme()
	if wantS, wantOK := k.SchemeOf(key); s != wantS || ok != wantOK {
		t.Fatalf("%q: match says scheme %v (%v), SchemeOf %v (%v)", key, s, ok, wantS, wantOK)
	}
	if got, want := m.Immutable(), k.Immutable(key); got != want {
		t.Fatalf("%q: match says immutable %v, Immutable %v", key, got, want)
	}
}

// goldenKeys returns the client keys of the golden vectors.
func goldenKeys(t testing.TB) [][]byte {
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var keys [][]byte
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 5 {
			t.Fatalf("bad golden line %q", line)
		}
		key, err := strconv.Unquote(fields[3])
		if err != nil {
			t.Fatalf("bad quoting in golden line %q", line)
		}
		keys = append(keys, []byte(key))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestOneMatchAnswersAsTheSeparateCalls(t *testing.T) {
	keys := goldenKeys(t)
	if len(keys) == 0 {
		t.Fatal("no golden vectors")
	}
	for _, key := range []string{
		"P2:tenant:" + blockA + ":am9i",
		"IDX:t:" + blockA + ":x\x01",
		"subrange:" + blockA + "/chunks/000001:0:16000",
		"subrange:tenant/bucket-index.json.gz:0:10",
		"1@QS:team_a|team_b|team_c:" + hash43,
		"no scheme matches this key",
		"~",
	} {
		keys = append(keys, []byte(key))
	}
	for i, k := range matchKeyspaces(t) {
		t.Run("settings "+strconv.Itoa(i), func(t *testing.T) {
			// One Match kept for every key, as a connection keeps one,
			// goes from key to key with what the last left in it: the
			// rewrite, asked first, notes which segments fit.
			var kept Match
			for j, key := range keys {
				if ok, _ := k.Check(key); ok {
					checkMatch(t, k, key)
					k.MatchInto(&kept, key)
					checkAnswers(t, k, key, &kept)
					if j%2 == 0 {
						kept.Forget()
					}
				}
			}
		})
	}
}

// BenchmarkKeyQuestions measures what the proxy pays to learn everything
// it asks of a request key (tenant, scheme, immutability, upstream key):
// asked one call at a time, each call matches the key against the schemes
// again; from one Match, the key is matched once. A Mimir postings key
// that passes unchanged is the common case; the 282-byte LV2 key is
// rewritten, which AppendRewrite matches for once more on its own.
func BenchmarkKeyQuestions(b *testing.B) {
	k := newKeyspace(b, nil)
	for _, bc := range []struct {
		name string
		key  []byte
	}{
		{"mimir-p2-passes", []byte("P2:tenant-1:" + blockA + ":am9iOmFwaQ")},
		{"mimir-lv2-282B-rewritten", []byte(lv2Key(tenantID("acme", 150), blockA, lv2Label282))},
	} {
		dst := make([]byte, 0, 256)
		b.Run(bc.name+"/separate-calls", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				k.Tenant(bc.key)
				k.SchemeOf(bc.key)
				k.Immutable(bc.key)
				dst, _, _ = k.AppendRewrite(dst[:0], bc.key)
			}
		})
		b.Run(bc.name+"/one-match", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := k.Match(bc.key)
				m.Tenant()
				m.Scheme()
				m.Immutable()
				dst, _, _ = m.AppendRewrite(dst[:0])
			}
		})
	}
}

// BenchmarkMatchTenant measures what every key of a get pays with the
// per-tenant metrics on: one match into the Match it keeps, asked for the
// tenant. Most keys of a
// store-gateway match a scheme; a key of another client matches none, and
// the patterns that start with a placeholder try it all the same.
func BenchmarkMatchTenant(b *testing.B) {
	k := newKeyspace(b, nil)
	for _, bc := range []struct {
		name string
		key  []byte
	}{
		{"mimir-p2", []byte("P2:tenant-1:" + blockA + ":am9iOmFwaQ")},
		{"no-scheme", []byte("lg:0000012345")},
		{"cross-tenant", []byte("1@QS:team_a|team_b:" + blockA)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var m Match // kept, as a connection keeps one
			b.ReportAllocs()
			for b.Loop() {
				k.MatchInto(&m, bc.key)
				if m.Tenant() == nil && bc.name != "no-scheme" {
					b.Fatal("no tenant")
				}
				m.Forget()
			}
		})
	}
}
