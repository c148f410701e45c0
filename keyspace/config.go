package keyspace

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Limits on the key settings. memcached's KEY_MAX_LENGTH is a compile-time
// 250 and gomemcache refuses longer keys, so the upstream limit can only be
// lowered; it must leave room for a whole-key hash ("~~" and 43 characters)
// and some readable text. The client limit stays under the 1 MiB retrieval
// line the proxy reads at most.
const (
	minMaxLength       = 64
	upstreamMaxLength  = 250
	maxMaxClientLength = 1 << 20
)

// Config holds the key settings.
type Config struct {
	// MaxLength is the longest key sent upstream; longer keys are rewritten.
	MaxLength int
	// MaxClientLength is the longest key a client may send.
	MaxClientLength int
	// Presets names the built-in schemes that are on: preset names, the
	// groups mimir, thanos, cortex, bucket and results, all, or none.
	Presets []string
	// Schemes holds user-defined schemes, NAME[+postings][+immutable]=PATTERN
	// each.
	Schemes []string

	// TestHashChars, when not zero, cuts every hash the rewrite emits (tenant
	// and segment tokens and the whole-key hash) to this many base64
	// characters. Tests set it to 1 or 2 to make upstream keys collide on
	// purpose; it is no flag, because it breaks the documented mapping.
	TestHashChars int
}

// RegisterFlags adds the key settings to fs, with defaults for a sidecar of
// a Mimir store-gateway.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.MaxLength, "key-max-length", upstreamMaxLength, "longest key sent upstream; longer keys, and keys holding a control byte or DEL, are rewritten by hashing their tenant-bearing segments first (64 to 250)")
	fs.IntVar(&c.MaxClientLength, "key-max-client-length", 65536, "longest key a client may send, for every command (a federated query's results key lists every tenant); longer or empty keys get CLIENT_ERROR")
	fs.StringSliceVar(&c.Presets, "key-schemes", []string{"all"}, "built-in key schemes that are on: preset names (mimir-p2, thanos-p, …), groups (mimir, thanos, cortex, bucket, results), all or none")
	fs.StringArrayVar(&c.Schemes, "key-scheme", nil, "user key scheme, repeatable: NAME[+postings][+immutable]=PATTERN (+postings: values are postings lists, compressed and verified; +immutable: a value never changes once written, so the local tier may keep it) with placeholders {tenant} {tenants} {ulid} {} {1}..{9}, e.g. 'loki-idx=IDX:{tenant}:{ulid}:{1}'; tried before the built-in schemes")
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	_, err := c.compile()
	return err
}

// compile checks every setting and builds the scheme table the rewrite
// consults, user schemes first, then the chosen presets in table order.
func (c *Config) compile() ([]*pattern, error) {
	switch {
	case c.MaxLength < minMaxLength || c.MaxLength > upstreamMaxLength:
		return nil, fmt.Errorf("--key-max-length must be between %d and %d", minMaxLength, upstreamMaxLength)
	case c.MaxClientLength < c.MaxLength:
		return nil, fmt.Errorf("--key-max-client-length %d: must be at least --key-max-length (%d)", c.MaxClientLength, c.MaxLength)
	case c.MaxClientLength > maxMaxClientLength:
		return nil, fmt.Errorf("--key-max-client-length must be at most %d", maxMaxClientLength)
	case c.TestHashChars < 0 || c.TestHashChars > wholeChars:
		return nil, fmt.Errorf("TestHashChars must be between 0 and %d", wholeChars)
	}
	on, err := choosePresets(c.Presets)
	if err != nil {
		return nil, fmt.Errorf("--key-schemes: %w", err)
	}
	var pats []*pattern
	users := map[string]*Scheme{}
	for _, def := range c.Schemes {
		s, p, err := parseSchemeFlag(def)
		if err != nil {
			return nil, fmt.Errorf("--key-scheme %q: %w", def, err)
		}
		if _, ok := presetByName[s.Name]; ok || s.Name == NoScheme {
			return nil, fmt.Errorf("--key-scheme %q: name %s is reserved for a built-in scheme", def, s.Name)
		}
		if prev, ok := users[s.Name]; ok {
			if prev.Postings != s.Postings {
				return nil, fmt.Errorf("--key-scheme %q: scheme %s is given both with and without +postings", def, s.Name)
			}
			if prev.Immutable != s.Immutable {
				return nil, fmt.Errorf("--key-scheme %q: scheme %s is given both with and without +immutable", def, s.Name)
			}
			s = prev
		}
		users[s.Name] = s
		p.scheme = s
		pats = append(pats, p)
	}
	for _, ps := range presets {
		if on[ps.name] {
			pats = append(pats, ps.patterns...)
		}
	}
	return pats, nil
}
