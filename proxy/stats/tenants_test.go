package stats

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// hashedLabel is the documented label of a tenant ID that cannot be its
// own: the first bytes that fit, '~', and 12 hex digits of its SHA-256.
func hashedLabel(readable, tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return readable + "~" + hex.EncodeToString(sum[:])[:12]
}

func TestTenantLabelRules(t *testing.T) {
	at150 := tenant150
	over := at150 + "-one"
	accents := strings.Repeat("é", 100) // 200 bytes, two a rune
	free := func(string) bool { return false }
	for _, c := range []struct{ name, tenant, want string }{
		{"an ID that fits is its own label", "team-a", "team-a"},
		{"an ID of 150 bytes is its own label", at150, at150},
		{"an ID over 150 bytes keeps 137 bytes and a hash of the whole", over, hashedLabel(over[:137], over)},
		{"a cut never splits a character", accents, hashedLabel(accents[:136], accents)},
		{"an ID that is not UTF-8 reads with a replacement character", "bad\xffid", hashedLabel("bad\uFFFDid", "bad\xffid")},
		{"an ID named other is not other", "other", hashedLabel("other", "other")},
		{"an ID holding ~ is hashed, so it never equals a hashed label", "a~b", hashedLabel("a~b", "a~b")},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := TenantLabel(c.tenant, free)
			if got != c.want {
				t.Errorf("label %q, want %q", got, c.want)
			}
			if len(got) > maxTenantLabel || !utf8.ValidString(got) {
				t.Errorf("label %q: %d bytes, valid UTF-8 %v", got, len(got), utf8.ValidString(got))
			}
		})
	}
	t.Run("a label taken by another gets a longer hash", func(t *testing.T) {
		short := hashedLabel(over[:137], over)
		got := TenantLabel(over, func(l string) bool { return l == short })
		sum := sha256.Sum256([]byte(over))
		if want := over[:maxTenantLabel-25] + "~" + hex.EncodeToString(sum[:])[:24]; got != want {
			t.Errorf("label %q, want %q", got, want)
		}
	})
}

func TestPerTenantTableStaysBoundedAndFindsTheHeavyHitter(t *testing.T) {
	tt := NewTenants(3)
	// 200 tenants take the slots and the sketch in turn; one of them
	// sends every other request, and must end up with a slot of its own.
	for i := range 2000 {
		tenant := "tenant-" + strconv.Itoa(i%200)
		if i%2 == 0 {
			tenant = "tenant-hot"
		}
		if c := tt.Counters([]byte(tenant)); c != nil {
			c.Requests.Add(1)
		}
		if i%100 == 99 {
			tt.Rebalance()
		}
	}
	slots := *tt.slots.Load()
	if len(slots) != 3 {
		t.Errorf("%d tenants with a slot, want 3", len(slots))
	}
	if slots["tenant-hot"] == nil {
		t.Errorf("the tenant sending half the requests has no slot; slots: %v", slices.Collect(maps.Keys(slots)))
	}
	if len(tt.cand) > 3 {
		t.Errorf("%d candidates, want at most 3", len(tt.cand))
	}
	var total uint64
	for _, c := range tt.Snapshot() {
		total += c.Requests.Load()
	}
	// Evicted tenants fold into other: nothing counted is lost.
	if total != 2000 {
		t.Errorf("the tenant series sum to %d requests, want 2000", total)
	}
	hot := []byte("tenant-hot")
	if n := testing.AllocsPerRun(100, func() { tt.Counters(hot) }); n != 0 {
		t.Errorf("a tenant with a slot costs %v allocations", n)
	}
}

// tenant150 is a tenant ID of Mimir's largest size, 150 bytes.
var tenant150 = ("org-a-" + strings.Repeat("team.platform_(eu-west-1)*", 6))[:150]
