package codec

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	var cfg Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return cfg, cfg.Validate()
}

func TestDefaultsSuitAMimirSidecar(t *testing.T) {
	cfg, err := parseFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FlagBit != 30 || !slices.Equal(cfg.Prefixes, []string{"P2:", "E2:", "SP2:", "P:", "E:", "EP:", "SP:"}) ||
		cfg.MinSize != 64 || cfg.MinSavings != 0.1 || cfg.DeleteCorrupt {
		t.Fatalf("defaults %+v", cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.FlagMask() != 0x40000000 {
		t.Fatalf("mask %#x", c.FlagMask())
	}
}

func TestFlagsParse(t *testing.T) {
	cfg, err := parseFlags(t, "--codec-flag-bit=24", "--codec-prefixes=P2:,S:", "--codec-min-size=0",
		"--codec-min-savings=0.25", "--codec-delete-corrupt")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FlagBit != 24 || !slices.Equal(cfg.Prefixes, []string{"P2:", "S:"}) || cfg.MinSize != 0 || cfg.MinSavings != 0.25 || !cfg.DeleteCorrupt {
		t.Fatalf("parsed %+v", cfg)
	}
	cfg, err = parseFlags(t, "--codec-prefixes=")
	if err != nil || len(cfg.Prefixes) != 0 {
		t.Fatalf("an empty --codec-prefixes gave %q, %v; want none", cfg.Prefixes, err)
	}
	// Registering twice must not share the default slice.
	a, _ := parseFlags(t)
	a.Prefixes[0] = "changed"
	if DefaultPrefixes[0] != "P2:" {
		t.Fatal("a Config aliased DefaultPrefixes")
	}
}

func TestBadSettingsAreRefusedWithTheirFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--codec-flag-bit=32"}, "--codec-flag-bit"},
		{[]string{"--codec-prefixes=P2:,,E2:"}, "--codec-prefixes"},
		{[]string{"--codec-prefixes=P 2:"}, "--codec-prefixes"},
		{[]string{"--codec-min-size=-1"}, "--codec-min-size"},
		{[]string{"--codec-min-savings=-0.1"}, "--codec-min-savings"},
		{[]string{"--codec-min-savings=1.5"}, "--codec-min-savings"},
		{[]string{"--codec-min-savings=NaN"}, "--codec-min-savings"},
	} {
		_, err := parseFlags(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want one line naming %s", tc.args, err, tc.want)
		}
	}
	if _, err := New(Config{FlagBit: 40}); err == nil {
		t.Error("New accepted a config Validate refuses")
	}
	if _, err := New(Config{MinSavings: math.Inf(1)}); err == nil {
		t.Error("New accepted infinite savings")
	}
}
