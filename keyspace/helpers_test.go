package keyspace

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Block IDs as store-gateways print them.
const (
	blockA = "01HZX3K5R9W1V8Q2N4M6P7T0AB"
	blockB = "01J0ABCDEFGHJKMNPQRSTVWXYZ"
)

// hash43 stands for a base64url blake2b-256 a store-gateway put in a key.
const hash43 = "n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg"

// defaultConfig returns the settings a proxy gets with no key flags.
func defaultConfig(t testing.TB) Config {
	t.Helper()
	var c Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// newKeyspace builds a Keyspace from the default settings changed by edit.
func newKeyspace(t testing.TB, edit func(*Config)) *Keyspace {
	t.Helper()
	c := defaultConfig(t)
	if edit != nil {
		edit(&c)
	}
	k, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// tenantID returns a Mimir-legal tenant ID of n bytes that differs for
// every seed.
func tenantID(seed string, n int) string {
	s := "org-" + seed + "-"
	for len(s) < n {
		s += "team.platform_(eu-west-1)*"
	}
	return s[:n]
}

// checkUpstreamKey fails t unless out is what the proxy may send upstream
// for key: the key itself when it needs no rewrite, otherwise at most the
// limit, legal bytes only, starting with '~'.
func checkUpstreamKey(t testing.TB, k *Keyspace, key, out []byte, step Step) {
	t.Helper()
	if !k.NeedsRewrite(key) {
		if step != StepNone || !bytes.Equal(out, key) {
			t.Fatalf("key %q needs no rewrite but became %q (step %v)", key, out, step)
		}
		return
	}
	if step == StepNone {
		t.Fatalf("key %q needs a rewrite but step is none", key)
	}
	if len(out) == 0 || len(out) > k.MaxLength() {
		t.Fatalf("key %q became %d bytes, limit %d: %q", key, len(out), k.MaxLength(), out)
	}
	if out[0] != marker {
		t.Fatalf("rewritten key %q does not start with %q", out, marker)
	}
	for _, c := range out {
		if c <= ' ' || c == 0x7f {
			t.Fatalf("rewritten key %q holds byte %#x", out, c)
		}
	}
}

// lv2Label282 is a label name that makes lv2Key(tenantID(…, 150), …) 282
// bytes long: a Mimir LV2 key for a 150-byte tenant that memcached refuses.
const lv2Label282 = "kubernetes_io_hostname_and_some_longer_label_name_xyz123"

// lv2Key is a Mimir label-values key.
func lv2Key(tenant, block, label string) string {
	return "LV2:" + tenant + ":" + block + ":" + label + ":" + hash43
}

// crossTenantKey is a query-frontend results key of exactly size bytes
// whose tenant segment lists many tenants joined by '|'.
func crossTenantKey(size int) string {
	const prefix, suffix = "1@QS:", ":" + hash43 + ":60000:1700000000000"
	var ts strings.Builder
	for i := 0; ts.Len() < size; i++ {
		if i > 0 {
			ts.WriteByte('|')
		}
		ts.WriteString(tenantID(string(rune('a'+i%26))+strings.Repeat("x", i/26), 12+i%30))
	}
	tenants := ts.String()[:size-len(prefix)-len(suffix)]
	tenants = strings.TrimRight(tenants, "|") + strings.Repeat("z", len(tenants)-len(strings.TrimRight(tenants, "|")))
	return prefix + tenants + suffix
}
