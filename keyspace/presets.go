package keyspace

import (
	"fmt"
	"slices"
	"strings"
)

// preset is a built-in scheme. Its name, patterns and place in the table
// are part of the key mapping: changing any of them moves keys upstream,
// which the golden vectors in testdata/ catch.
type preset struct {
	name     string
	group    string
	scheme   *Scheme
	patterns []*pattern
}

// presetDefs lists the built-in schemes in the order they are tried. Mimir
// comes before Thanos: both write "P:" and "S:" keys, Mimir with the tenant
// first and the block second, Thanos with the block first. Each Mimir pattern
// asks for a ULID in the second segment, which a Thanos key never has there,
// while a Mimir tenant may well look like a ULID; trying Mimir first reads
// both kinds right. Within a scheme, a precise pattern comes before the
// catch-all that hashes the whole tail.
//
// Every index-cache kind of Mimir and Thanos is keyed by an immutable block
// (its ULID): the value stored under such a key never changes, and those
// schemes are immutable. The caching bucket's keys are not, but for its
// byte ranges of an object inside a block (subrange:<ulid>/…), which is
// immutable too; its other verbs read objects that do change (deletion
// marks, bucket indexes, listings). Results-cache keys change.
var presetDefs = []struct {
	name, group string
	postings    bool
	patterns    []string
}{
	// Mimir store-gateway index cache (pkg/storegateway/indexcache).
	{"mimir-p2", "mimir", true, []string{"P2:{tenant}:{ulid}:{1}"}},
	{"mimir-s", "mimir", false, []string{"S:{tenant}:{ulid}:{}"}},
	{"mimir-e2", "mimir", true, []string{"E2:{tenant}:{ulid}:{1}:{}", "E2:{tenant}:{ulid}:{1}"}},
	// The postings hash is hashed before the shard selector: it saves 26
	// bytes, which keeps a selector like 3_of_64_by_cluster,namespace
	// readable for longer.
	{"mimir-sp2", "mimir", false, []string{"SP2:{tenant}:{ulid}:{2}:{1}", "SP2:{tenant}:{ulid}:{1}"}},
	{"mimir-ln", "mimir", false, []string{"LN:{tenant}:{ulid}:{1}"}},
	// The raw label name is the unbounded segment: it goes first.
	{"mimir-lv2", "mimir", false, []string{"LV2:{tenant}:{ulid}:{1}:{2}", "LV2:{tenant}:{ulid}:{1}"}},
	{"mimir-c", "mimir", false, []string{"C:{tenant}:{ulid}:{}:{}", "C:{tenant}:{ulid}:{1}"}},
	{"mimir-po", "mimir", false, []string{"PO{tenant}:{ulid}:{1}"}},
	// Older Mimir prefixes: tenant and block stay readable, the tail is
	// hashed as one, whatever its inner shape was.
	{"mimir-p", "mimir", true, []string{"P:{tenant}:{ulid}:{1}"}},
	{"mimir-e", "mimir", true, []string{"E:{tenant}:{ulid}:{1}"}},
	{"mimir-ss", "mimir", false, []string{"SS:{tenant}:{ulid}:{1}"}},
	{"mimir-lv", "mimir", false, []string{"LV:{tenant}:{ulid}:{1}"}},
	{"mimir-sp", "mimir", false, []string{"SP:{tenant}:{ulid}:{1}"}},
	// Thanos and Cortex index cache (pkg/store/cache): no tenant, block
	// first. These keys are short; the schemes matter for their control
	// bytes and for the postings flag.
	{"thanos-p", "thanos", true, []string{"P:{ulid}:{1}:{}", "P:{ulid}:{1}"}},
	{"thanos-ep", "thanos", true, []string{"EP:{ulid}:{1}:{}", "EP:{ulid}:{1}"}},
	{"thanos-s", "thanos", false, []string{"S:{ulid}:{}"}},
	// Caching bucket (Thanos, Cortex, Mimir): <verb>:<object name>[:…]. The
	// object name starts with the tenant in multi-tenant stores and with the
	// block in Thanos.
	{"bucket", "bucket", false, bucketPatterns("content", "exists", "attrs", "subrange", "iter")},
	// Query-frontend results: a tenant segment of several tenants joined by
	// '|', e.g. 1@QS:team_a|team_b|…:<rest> (grafana/mimir#11414).
	{"results", "results", false, []string{"{tenants}:{1}", "{}:{tenants}:{1}", "{}:{tenants}"}},
}

func bucketPatterns(verbs ...string) []string {
	var ps []string
	for _, v := range verbs {
		ps = append(ps, v+":{ulid}/{1}", v+":{tenant}/{ulid}/{1}", v+":{tenant}/{1}")
	}
	return ps
}

// presets and presetByName are built once from presetDefs; a bad definition
// is a programming error caught by every test run.
var presets, presetByName = buildPresets()

// immutablePatterns are the patterns of mutable built-in schemes whose
// keys name an immutable object all the same: byte ranges of block files.
var immutablePatterns = map[string]bool{"subrange:{ulid}/{1}": true, "subrange:{tenant}/{ulid}/{1}": true}

func buildPresets() ([]*preset, map[string]*preset) {
	var list []*preset
	byName := map[string]*preset{}
	for _, d := range presetDefs {
		immutable := d.group == "mimir" || d.group == "thanos"
		ps := &preset{name: d.name, group: d.group, scheme: &Scheme{Name: d.name, Postings: d.postings, Immutable: immutable}}
		for _, text := range d.patterns {
			p, err := parsePattern(text)
			if err != nil {
				panic(fmt.Sprintf("keyspace: preset %s: %v", d.name, err))
			}
			p.scheme, p.immutable = ps.scheme, immutable || immutablePatterns[text]
			ps.patterns = append(ps.patterns, p)
		}
		list = append(list, ps)
		byName[d.name] = ps
	}
	return list, byName
}

// presetGroups names sets of presets; cortex writes what thanos writes.
var presetGroups = map[string]string{"mimir": "mimir", "thanos": "thanos", "cortex": "thanos"}

// Presets returns the built-in scheme names in the order they are tried.
func Presets() []string {
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.name
	}
	return names
}

// choosePresets turns --key-schemes into the set of presets that are on.
func choosePresets(sel []string) (map[string]bool, error) {
	on := map[string]bool{}
	for _, s := range sel {
		s = strings.TrimSpace(s)
		switch {
		case s == "all":
			for _, p := range presets {
				on[p.name] = true
			}
		case s == "none":
			if len(sel) > 1 {
				return nil, fmt.Errorf("none cannot be combined with other names")
			}
		case presetByName[s] != nil:
			on[s] = true
		case presetGroups[s] != "":
			for _, p := range presets {
				if p.group == presetGroups[s] {
					on[p.name] = true
				}
			}
		default:
			known := append(Presets(), "mimir", "thanos", "cortex", "all", "none")
			slices.Sort(known)
			return nil, fmt.Errorf("unknown scheme %q (known: %s)", s, strings.Join(known, ", "))
		}
	}
	return on, nil
}
