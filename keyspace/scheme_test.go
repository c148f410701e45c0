package keyspace

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestBuiltInSchemesReadTheRealKeyFormats(t *testing.T) {
	k := newKeyspace(t, nil)
	t150 := tenantID("acme", 150)
	cases := []struct {
		name, key, scheme string
		postings          bool
	}{
		{"mimir postings", "P2:" + t150 + ":" + blockA + ":am9iOmFwaQ", "mimir-p2", true},
		{"mimir series", "S:tenant:" + blockA + ":1234", "mimir-s", false},
		{"mimir expanded postings", "E2:tenant:" + blockA + ":" + hash43 + ":speculative", "mimir-e2", true},
		{"mimir series for postings, all shards", "SP2:tenant:" + blockA + ":all:" + hash43, "mimir-sp2", false},
		{"mimir series for postings, shard by labels", "SP2:tenant:" + blockA + ":3_of_64_by_cluster,namespace:" + hash43, "mimir-sp2", false},
		{"mimir label names", "LN:tenant:" + blockA + ":" + hash43, "mimir-ln", false},
		{"mimir label values", lv2Key("tenant", blockA, "job"), "mimir-lv2", false},
		{"mimir chunks", "C:tenant:" + blockA + ":1700000000000:3", "mimir-c", false},
		{"mimir postings offsets, no colon after PO", "POtenant:" + blockA + ":am9i", "mimir-po", false},
		{"mimir old postings with raw label", "P:tenant:" + blockA + ":job:api:v2", "mimir-p", true},
		{"mimir old expanded postings", "E:tenant:" + blockA + ":" + hash43, "mimir-e", true},
		{"mimir old SS", "SS:tenant:" + blockA + ":x", "mimir-ss", false},
		{"mimir old LV", "LV:tenant:" + blockA + ":job:" + hash43, "mimir-lv", false},
		{"mimir old SP", "SP:tenant:" + blockA + ":1_of_2:" + hash43, "mimir-sp", false},
		{"mimir P whose tenant looks like a ULID", "P:" + blockB + ":" + blockA + ":job:api", "mimir-p", true},
		{"thanos postings", "P:" + blockA + ":" + hash43 + ":dss", "thanos-p", true},
		{"thanos postings, older without dss", "P:" + blockA + ":" + hash43, "thanos-p", true},
		{"thanos expanded postings", "EP:" + blockA + ":" + hash43 + ":dss", "thanos-ep", true},
		{"thanos series", "S:" + blockA + ":98765", "thanos-s", false},
		{"caching bucket, Thanos block", "content:" + blockA + "/meta.json", "bucket", false},
		{"caching bucket, tenant block", "subrange:tenant/" + blockA + "/chunks/000001:0:16000", "bucket", false},
		{"caching bucket, tenant index", "exists:tenant/bucket-index.json.gz", "bucket", false},
		{"query results across tenants", "1@QS:team_a|team_b|team_c:" + hash43, "results", false},
		{"query results across tenants, bare", "team_a|team_b:sum(up):60000:0", "results", false},
		{"lowercase block is no ULID", "P2:tenant:" + strings.ToLower(blockA) + ":am9i", "", false},
		{"block too short", "P2:tenant:" + blockA[1:] + ":am9i", "", false},
		{"empty tenant", "P2::" + blockA + ":am9i", "", false},
		{"single-tenant results key", "1@QS:team_a:" + hash43, "", false},
		{"unknown prefix", "X:tenant:" + blockA, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := k.SchemeOf([]byte(tc.key))
			switch {
			case tc.scheme == "" && ok:
				t.Errorf("scheme %s, want none", s.Name)
			case tc.scheme == "":
			case !ok:
				t.Errorf("no scheme, want %s", tc.scheme)
			case s.Name != tc.scheme || s.Postings != tc.postings:
				t.Errorf("scheme %s (postings %v), want %s (postings %v)", s.Name, s.Postings, tc.scheme, tc.postings)
			}
		})
	}
}

func TestUserSchemesComeBeforeBuiltInOnes(t *testing.T) {
	k := newKeyspace(t, func(c *Config) {
		c.Schemes = []string{
			"mine+postings=P2:{tenant}:{}",
			"loki-index=IDX:{tenant}:{ulid}:{1}",
			"loki-index=IDX2:{tenant}:{1}",
		}
	})
	if s, _ := k.SchemeOf([]byte("P2:tenant:" + blockA + ":am9i")); s.Name != "mine" || !s.Postings {
		t.Errorf("P2 key read by %v, want user scheme mine", s)
	}
	for _, key := range []string{"IDX:t:" + blockA + ":x", "IDX2:t:x"} {
		if s, _ := k.SchemeOf([]byte(key)); s.Name != "loki-index" {
			t.Errorf("%s read by %v, want loki-index", key, s)
		}
	}
	names := k.SchemeNames()
	if names[0] != "mine" || names[1] != "loki-index" || names[len(names)-1] != NoScheme || slices.Contains(names[2:len(names)-1], "loki-index") {
		t.Errorf("SchemeNames = %v", names)
	}
}

func TestKeySchemesChoosesPresets(t *testing.T) {
	cases := []struct {
		sel  []string
		want []string
	}{
		{[]string{"all"}, Presets()},
		{[]string{"none"}, nil},
		{[]string{"thanos"}, []string{"thanos-p", "thanos-ep", "thanos-s"}},
		{[]string{"cortex", "bucket"}, []string{"thanos-p", "thanos-ep", "thanos-s", "bucket"}},
		// The order of the flag does not change the order of the table.
		{[]string{"results", "mimir-lv2", "mimir-p2"}, []string{"mimir-p2", "mimir-lv2", "results"}},
	}
	for _, tc := range cases {
		k := newKeyspace(t, func(c *Config) { c.Presets = tc.sel })
		got := k.SchemeNames()
		if want := append(slices.Clone(tc.want), NoScheme); !slices.Equal(got, want) {
			t.Errorf("--key-schemes=%s: schemes %v, want %v", strings.Join(tc.sel, ","), got, want)
		}
	}
}

func TestFlagsHaveSidecarDefaults(t *testing.T) {
	var c Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{
		"--key-scheme", "a=A:{tenant}:{1}",
		"--key-scheme", "b=SP9:{tenant}:3_of_64_by_cluster,namespace:{1}",
		"--key-schemes", "mimir,thanos",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxLength != 250 || c.MaxClientLength != 65536 || c.TestHashChars != 0 {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.Schemes) != 2 || !strings.Contains(c.Schemes[1], "cluster,namespace") {
		t.Errorf("--key-scheme split a pattern at a comma: %q", c.Schemes)
	}
	if !slices.Equal(c.Presets, []string{"mimir", "thanos"}) {
		t.Errorf("--key-schemes = %q", c.Presets)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

func TestValidateNamesTheBadSetting(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"upstream limit above memcached's", func(c *Config) { c.MaxLength = 251 }, "--key-max-length"},
		{"upstream limit too small for a whole-key hash", func(c *Config) { c.MaxLength = 63 }, "--key-max-length"},
		{"client limit below upstream limit", func(c *Config) { c.MaxClientLength = 200 }, "--key-max-client-length"},
		{"client limit beyond the request line", func(c *Config) { c.MaxClientLength = 2 << 20 }, "--key-max-client-length"},
		{"unknown preset", func(c *Config) { c.Presets = []string{"mimir-p3"} }, "unknown scheme"},
		{"none with others", func(c *Config) { c.Presets = []string{"none", "mimir"} }, "none"},
		{"scheme without =", func(c *Config) { c.Schemes = []string{"abc"} }, "NAME[+postings][+immutable]=PATTERN"},
		{"unknown option", func(c *Config) { c.Schemes = []string{"a+zip=A{tenant}"} }, "+zip"},
		{"bad name", func(c *Config) { c.Schemes = []string{"A B=A{tenant}"} }, "scheme name"},
		{"preset name", func(c *Config) { c.Schemes = []string{"mimir-p2=A{tenant}"} }, "reserved"},
		{"reserved name none", func(c *Config) { c.Schemes = []string{"none=A{tenant}"} }, "reserved"},
		{"postings disagree", func(c *Config) { c.Schemes = []string{"a+postings=A{tenant}", "a=B{tenant}"} }, "+postings"},
		{"immutable disagree", func(c *Config) { c.Schemes = []string{"a+immutable=A{tenant}", "a=B{tenant}"} }, "+immutable"},
		{"unknown option", func(c *Config) { c.Schemes = []string{"a+forever=A{tenant}"} }, "+forever"},
		{"empty pattern", func(c *Config) { c.Schemes = []string{"a="} }, "no placeholder"},
		{"literal only", func(c *Config) { c.Schemes = []string{"a=abc"} }, "no placeholder"},
		{"unknown placeholder", func(c *Config) { c.Schemes = []string{"a=A:{user}"} }, "unknown placeholder"},
		{"number out of range", func(c *Config) { c.Schemes = []string{"a=A:{10}"} }, "unknown placeholder"},
		{"gap in numbers", func(c *Config) { c.Schemes = []string{"a=A:{1}:{3}"} }, "without a gap"},
		{"number twice", func(c *Config) { c.Schemes = []string{"a=A:{1}:{1}"} }, "twice"},
		{"adjacent placeholders", func(c *Config) { c.Schemes = []string{"a=A:{tenant}{1}"} }, "separated"},
		{"unclosed brace", func(c *Config) { c.Schemes = []string{"a=A:{tenant"} }, "unclosed"},
		{"stray closing brace", func(c *Config) { c.Schemes = []string{"a=A}:{tenant}"} }, "unmatched"},
		{"marker in literal", func(c *Config) { c.Schemes = []string{"a=~A:{tenant}"} }, "literal byte"},
		{"space in literal", func(c *Config) { c.Schemes = []string{"a=A :{tenant}"} }, "literal byte"},
		{"too many placeholders", func(c *Config) { c.Schemes = []string{"a=" + strings.Repeat("{}:", 17)} }, "more than 16"},
		{"test hash length", func(c *Config) { c.TestHashChars = 44 }, "TestHashChars"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := defaultConfig(t)
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error naming %q", err, tc.want)
			}
			if _, err := New(c); err == nil {
				t.Error("New accepted what Validate refuses")
			}
		})
	}
}

func TestBracesCanBeLiteral(t *testing.T) {
	k := newKeyspace(t, func(c *Config) { c.Schemes = []string{"json={{t:{tenant}}}"} })
	key := "{t:" + tenantID("x", 260) + "}"
	out, step, scheme := k.AppendRewrite(nil, []byte(key))
	if scheme != "json" || step != StepTenant || !strings.HasPrefix(string(out), "~{t:~") || !strings.HasSuffix(string(out), "}") {
		t.Errorf("got %q, %v, %s", out, step, scheme)
	}
}

func TestTenantIsTheSchemesTenantSegment(t *testing.T) {
	k := newKeyspace(t, nil)
	t150 := tenantID("acme", 150)
	cases := []struct{ name, key, tenant string }{
		{"mimir postings, long tenant", "P2:" + t150 + ":" + blockA + ":am9iOmFwaQ", t150},
		{"mimir series", "S:tenant-1:" + blockA + ":1234", "tenant-1"},
		{"mimir postings offsets", "POteam:" + blockA + ":am9i", "team"},
		{"caching bucket, tenant block", "subrange:tenant-2/" + blockA + "/chunks/000001:0:16000", "tenant-2"},
		{"query results across tenants: the whole list", "1@QS:team_a|team_b:" + hash43, "team_a|team_b"},
		{"thanos key has no tenant", "P:" + blockA + ":" + hash43 + ":dss", ""},
		{"caching bucket, Thanos block", "content:" + blockA + "/meta.json", ""},
		{"unknown prefix", "X:tenant:" + blockA, ""},
		{"empty key", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(k.Tenant([]byte(tc.key))); got != tc.tenant {
				t.Errorf("tenant %q, want %q", got, tc.tenant)
			}
		})
	}
	key := []byte("P2:" + t150 + ":" + blockA + ":am9iOmFwaQ")
	if n := testing.AllocsPerRun(100, func() { k.Tenant(key) }); n != 0 {
		t.Errorf("Tenant: %v allocations", n)
	}
}

func TestImmutableKeys(t *testing.T) {
	k := newKeyspace(t, func(c *Config) {
		c.Schemes = []string{"loki-chunks+immutable=LC:{tenant}:{ulid}:{1}", "loki-meta=LM:{tenant}:{1}"}
	})
	for key, want := range map[string]bool{
		// Block-scoped index-cache kinds of Mimir and Thanos.
		"P2:tenant:" + blockA + ":am9i":                 true,
		"S:tenant:" + blockA + ":12345":                 true,
		"E2:tenant:" + blockA + ":aGFzaA:all":           true,
		"SP2:tenant:" + blockA + ":all:aGFzaA":          true,
		"LN:tenant:" + blockA + ":aGFzaA":               true,
		"LV2:tenant:" + blockA + ":job:aGFzaA":          true,
		"C:tenant:" + blockA + ":1024:10":               true,
		"P:" + blockA + ":aGFzaA:dss":                   true,
		"EP:" + blockA + ":aGFzaA:dss":                  true,
		"S:" + blockA + ":42":                           true,
		"subrange:" + blockA + "/chunks/000001:0:16000": true,
		"subrange:tenant/" + blockA + "/index:0:100":    true,
		// Objects that change: marks, indexes, listings, results.
		"content:tenant/" + blockA + "/deletion-mark.json":  false,
		"exists:tenant/" + blockA + "/no-compact-mark.json": false,
		"iter:tenant/:cfg":                          false,
		"attrs:tenant/bucket-index.json.gz":         false,
		"subrange:tenant/bucket-index.json.gz:0:10": false,
		"1@QS:team_a|team_b:query":                  false,
		"no scheme matches this key":                false,
		// User schemes say so themselves.
		"LC:tenant:" + blockA + ":x": true,
		"LM:tenant:x":                false,
	} {
		if got := k.Immutable([]byte(key)); got != want {
			t.Errorf("Immutable(%q) = %v, want %v", key, got, want)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { k.Immutable([]byte("P2:tenant:" + blockA + ":am9i")) }); allocs != 0 {
		t.Errorf("Immutable allocates %.0f times", allocs)
	}
}
