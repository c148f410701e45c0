package keyspace

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/blake2b"
)

func TestHashesAreWhatTheDocumentedShellRecipeComputes(t *testing.T) {
	k := newKeyspace(t, nil)
	// printf %s "$s" | b2sum -l 256 | xxd -r -p | basenc --base64url | tr -d =
	const (
		tenant1 = "jsETm6fP87zcpjsZpckHmsCmBXYKBaMLgyh3CjKKp8k" // tenant-1
		teamAB  = "-WbMX5cKHEfmxlYZVvgvjJvMpy72-xWU4qPZN9a-vkw" // team_a|team_b
		caslap  = "EXCvNdOCsJtSjqdyJYXT78O27lMemoEZJVPtqeq2AcU" // memcaslap\x01key
	)
	cases := []struct{ key, want string }{
		{"P2:tenant-1:" + blockA + ":am9i\x01", "~P2:~" + tenant1[:16] + ":" + blockA + ":~"},
		{"team_a|team_b:up\x01", "~~" + teamAB[:16] + ":~"},
		{"memcaslap\x01key", "~~" + caslap},
	}
	for _, tc := range cases {
		out, _, _ := k.AppendRewrite(nil, []byte(tc.key))
		if !strings.HasPrefix(string(out), tc.want) {
			t.Errorf("%q became %q, want it to start with %q", tc.key, out, tc.want)
		}
	}
}

func TestLongMimirKeysKeepTheirBlockReadable(t *testing.T) {
	k := newKeyspace(t, nil)
	t150 := tenantID("acme", 150)
	cases := []struct {
		name     string
		key      string
		step     Step
		readable []string
		hidden   []string
	}{
		{
			name: "282-byte LV2 key hashes only its tenant",
			key:  lv2Key(t150, blockA, lv2Label282), step: StepTenant,
			readable: []string{"~LV2:~", blockA, ":" + lv2Label282 + ":", hash43},
			hidden:   []string{t150},
		},
		{
			name: "LV2 key with a 200-byte label name hashes the label name next",
			key:  lv2Key(t150, blockA, strings.Repeat("label_name_", 18)+"xx"), step: StepSegments,
			readable: []string{blockA, hash43},
			hidden:   []string{t150, "label_name_"},
		},
		{
			name: "SP2 key with a by-label shard keeps the shard",
			key:  "SP2:" + t150 + ":" + blockA + ":3_of_64_by_cluster,namespace:" + hash43, step: StepTenant,
			readable: []string{blockA, ":3_of_64_by_cluster,namespace:", hash43},
		},
		{
			name: "E2 key at 255 bytes keeps hash and strategy",
			key:  "E2:" + t150 + ":" + blockA + ":" + hash43 + ":worst-case-small-posting-lists", step: StepTenant,
			readable: []string{blockA, hash43 + ":worst-case-small-posting-lists"},
		},
		{
			name: "segment holding the marker is hashed rather than kept",
			key:  "P2:" + t150 + "x:" + blockA + ":a~b" + strings.Repeat("c", 100), step: StepSegments,
			readable: []string{blockA},
			hidden:   []string{"a~b"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, step, _ := k.AppendRewrite(nil, []byte(tc.key))
			checkUpstreamKey(t, k, []byte(tc.key), out, step)
			if step != tc.step {
				t.Errorf("step %v, want %v: %q", step, tc.step, out)
			}
			for _, s := range tc.readable {
				if !strings.Contains(string(out), s) {
					t.Errorf("%q lost %q", out, s)
				}
			}
			for _, s := range tc.hidden {
				if strings.Contains(string(out), s) {
					t.Errorf("%q still holds %q", out, s)
				}
			}
		})
	}
}

func TestCrossTenantKeyOf4KiBBecomesOneToken(t *testing.T) {
	k := newKeyspace(t, func(c *Config) { c.MaxClientLength = 8192 })
	key := []byte(crossTenantKey(4096))
	if len(key) != 4096 || bytes.Count(key, []byte("|")) < 100 {
		t.Fatalf("fixture: %d bytes, %d tenants", len(key), bytes.Count(key, []byte("|"))+1)
	}
	if ok, r := k.Check(key); !ok {
		t.Fatalf("Check refused it: %v", r)
	}
	out, step, scheme := k.AppendRewrite(nil, key)
	checkUpstreamKey(t, k, key, out, step)
	want := "~1@QS:~" + string(appendHash(nil, key[5:bytes.LastIndex(key, []byte(":"+hash43))], tokenChars)) + ":" + hash43 + ":60000:1700000000000"
	if string(out) != want || step != StepTenant || scheme != "results" {
		t.Errorf("got %q (%v, %s), want %q", out, step, scheme, want)
	}
}

func TestKeysTheUpstreamCanCarryPassUnchanged(t *testing.T) {
	k := newKeyspace(t, nil)
	for _, key := range []string{"foo", strings.Repeat("k", 250), "P:" + blockA + ":" + hash43 + ":dss", "k\x80\xff", "a~b"} {
		dst := []byte("prefix ")
		out, step, scheme := k.AppendRewrite(dst, []byte(key))
		if string(out) != "prefix "+key || step != StepNone || scheme != "" {
			t.Errorf("%q became %q (%v, %q)", key, out, step, scheme)
		}
	}
}

func TestRewriteAppendsAfterWhatDstHolds(t *testing.T) {
	k := newKeyspace(t, nil)
	key := []byte(lv2Key(tenantID("acme", 150), blockA, lv2Label282))
	alone, _, _ := k.AppendRewrite(nil, key)
	dst := make([]byte, 3, 512)
	copy(dst, "abc")
	out, _, _ := k.AppendRewrite(dst, key)
	if string(out) != "abc"+string(alone) || &out[0] != &dst[0] {
		t.Errorf("appended %q, want %q in place", out, "abc"+string(alone))
	}
}

// A rewritten key is itself a legal short key, so a client that sends it
// verbatim reaches the same upstream key: SPEC §3 forwards every legal
// short key unchanged. The proxy keeps the two apart with the envelope's
// key binding, not with the key.
func TestRewrittenKeysPassUnchangedWhenSentVerbatim(t *testing.T) {
	k := newKeyspace(t, nil)
	for _, in := range goldenInputs() {
		out, step, _ := k.AppendRewrite(nil, []byte(in.key))
		if step == StepNone {
			continue
		}
		if k.NeedsRewrite(out) {
			t.Fatalf("%s: rewritten key %q would be rewritten again", in.name, out)
		}
		again, _, _ := k.AppendRewrite(nil, out)
		if !bytes.Equal(again, out) {
			t.Errorf("%s: %q maps to %q", in.name, out, again)
		}
	}
}

func TestMappingDependsOnlyOnKeyAndFlags(t *testing.T) {
	a := newKeyspace(t, func(c *Config) { c.Presets = []string{"mimir", "thanos", "bucket", "results"} })
	b := newKeyspace(t, func(c *Config) { c.Presets = []string{"results", "bucket", "thanos", "mimir"} })
	for _, in := range goldenInputs() {
		x, sx, nx := a.AppendRewrite(nil, []byte(in.key))
		y, sy, ny := b.AppendRewrite(make([]byte, 0, 300), []byte(in.key))
		z, _, _ := a.AppendRewrite(nil, []byte(in.key))
		if !bytes.Equal(x, y) || !bytes.Equal(x, z) || sx != sy || nx != ny {
			t.Errorf("%s: %q vs %q vs %q", in.name, x, y, z)
		}
	}
}

func TestALowerLimitPushesKeysToLaterSteps(t *testing.T) {
	k := newKeyspace(t, func(c *Config) { c.MaxLength = 100 })
	t150 := tenantID("acme", 150)
	cases := []struct {
		key  string
		step Step
	}{
		{"LN:" + t150 + ":" + blockA + ":am9i", StepTenant},
		{lv2Key(t150, blockA, strings.Repeat("j", 30)), StepSegments},
		{"C:" + t150 + ":" + blockA + ":" + strings.Repeat("1", 80) + ":12", StepWhole},
	}
	for _, tc := range cases {
		out, step, _ := k.AppendRewrite(nil, []byte(tc.key))
		checkUpstreamKey(t, k, []byte(tc.key), out, step)
		if step != tc.step {
			t.Errorf("%q: step %v, want %v (%q)", tc.key, step, tc.step, out)
		}
	}
}

// randomKey returns a key that is often near a real format and sometimes
// hostile: long segments, control bytes, markers, empty segments.
func randomKey(r *rand.Rand) []byte {
	pieces := []string{
		"P2:", "LV2:", "SP2:", "E2:", "S:", "P:", "EP:", "PO", "C:", "LN:", "subrange:", "content:", "1@QS:",
		blockA, blockB, hash43, ":", "|", "/", "~", "\x01", "\x7f", "\t", "\x80",
		"tenant", "3_of_64_by_cluster,namespace", "dss",
	}
	var b []byte
	for n := r.IntN(12); n >= 0; n-- {
		switch r.IntN(4) {
		case 0:
			b = append(b, strings.Repeat(string(rune('a'+r.IntN(26))), r.IntN(200))...)
		default:
			b = append(b, pieces[r.IntN(len(pieces))]...)
		}
	}
	if len(b) == 0 {
		b = append(b, 'k')
	}
	return b
}

func TestRewrittenKeysAreShortLegalAndStable(t *testing.T) {
	configs := map[string]func(*Config){
		"default": nil,
		"limit 64 with user schemes": func(c *Config) {
			c.MaxLength = 64
			c.Schemes = []string{"u=P2:{tenant}:{ulid}:{2}:{1}", "v={}|{tenants}/{3}:{2}:{1}"}
		},
		"no presets": func(c *Config) { c.Presets = []string{"none"} },
	}
	for name, edit := range configs {
		t.Run(name, func(t *testing.T) {
			k := newKeyspace(t, edit)
			k2 := newKeyspace(t, edit)
			r := rand.New(rand.NewPCG(1, 2))
			buf := make([]byte, 0, 256)
			for range 20000 {
				key := randomKey(r)
				if ok, _ := k.Check(key); !ok {
					continue
				}
				out, step, _ := k.AppendRewrite(nil, key)
				checkUpstreamKey(t, k, key, out, step)
				again, step2, _ := k2.AppendRewrite(buf[:0], key)
				if !bytes.Equal(out, again) || step != step2 {
					t.Fatalf("%q: %q then %q", key, out, again)
				}
			}
		})
	}
}

// One million distinct long keys, a quarter for each step and kind, must
// land on one million distinct upstream keys. Upstream keys are compared by
// a 128-bit digest to keep memory small; a false alarm would need a digest
// collision.
func TestMillionDistinctKeysStayDistinct(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	k := newKeyspace(t, nil)
	seen := make(map[[16]byte]int, n)
	var key, out []byte
	t150 := tenantID("acme", 150)
	steps := map[Step]int{}
	for i := range n {
		key = key[:0]
		num := strconv.AppendInt(nil, int64(i), 10)
		switch i % 4 {
		case 0: // many tenants, same label: step 1, told apart by the tenant token
			key = append(key, "LV2:"...)
			key = append(key, tenantID(string(num), 200)...)
			key = append(key, ":"+blockA+":job:"+hash43...)
		case 1: // one tenant, long label names: step 2, told apart by the label token
			key = append(key, "LV2:"+t150+":"+blockA+":label_"...)
			key = append(key, num...)
			key = append(key, strings.Repeat("_", 180)+":"+hash43...)
		case 2: // cross-tenant lists, told apart by the tenants token
			key = append(key, "1@QS:team_a|team_b|"...)
			key = append(key, num...)
			key = append(key, "|"+strings.Repeat("team_c|", 40)+"team_z:"+hash43...)
		case 3: // no scheme: step 3
			key = append(key, "session/"...)
			key = append(key, num...)
			key = append(key, strings.Repeat("/x", 150)...)
		}
		var step Step
		out, step, _ = k.AppendRewrite(out[:0], key)
		steps[step]++
		sum := blake2b.Sum256(out)
		d := [16]byte(sum[:16])
		if j, dup := seen[d]; dup {
			t.Fatalf("keys %d and %d both became %q", j, i, out)
		}
		seen[d] = i
	}
	if steps[StepTenant] != n/2 || steps[StepSegments] != n/4 || steps[StepWhole] != n/4 {
		t.Errorf("steps %v, want half tenant, a quarter each segments and whole", steps)
	}
}

// With one-character hashes only 64 tokens exist, so distinct keys must
// share upstream keys: the situation the proxy's envelope binding has to
// turn into misses. This is the knob its collision test uses.
func TestOneCharacterHashesForceCollisions(t *testing.T) {
	k := newKeyspace(t, func(c *Config) { c.TestHashChars = 1 })
	byOut := map[string]string{}
	collisions := 0
	for i := range 200 {
		key := "P2:" + tenantID(strconv.Itoa(i), 240) + ":" + blockA + ":am9i"
		out, step, _ := k.AppendRewrite(nil, []byte(key))
		checkUpstreamKey(t, k, []byte(key), out, step)
		if len(out) != len("~P2:~x:"+blockA+":am9i") {
			t.Fatalf("token not cut to one character: %q", out)
		}
		if prev, ok := byOut[string(out)]; ok && prev != key {
			collisions++
		}
		byOut[string(out)] = key
	}
	if collisions == 0 || len(byOut) > 64 {
		t.Errorf("%d collisions among 200 keys onto %d upstream keys", collisions, len(byOut))
	}
	out, step, _ := k.AppendRewrite(nil, []byte("memcaslap\x01"))
	if step != StepWhole || len(out) != 3 {
		t.Errorf("whole-key hash not cut: %q", out)
	}
}
