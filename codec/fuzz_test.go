package codec

import (
	"bytes"
	"testing"
)

// addSeeds seeds a fuzz target with the fixtures, values cut to 600 bytes:
// the fuzzer minimizes every new interesting input, and that takes seconds
// on inputs of kilobytes, during which it fuzzes nothing.
func addSeeds(f *testing.F, extra func(fx fixture) []any) {
	for _, fx := range fixtures() {
		fx.value = fx.value[:min(len(fx.value), 600)]
		f.Add(append([]any{fx.key, fx.value, fx.flags, fx.bind}, extra(fx)...)...)
	}
}

// FuzzDecode feeds the decoder arbitrary bytes (it must never panic, and
// what it accepts must be a consistent envelope) and envelopes changed in
// one byte or in their flags (which it must always refuse).
func FuzzDecode(f *testing.F) {
	c := newTestCodec(f, nil)
	addSeeds(f, func(fx fixture) []any {
		stored, _ := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
		return []any{uint32(len(stored) / 2), byte(1), stored}
	})
	f.Fuzz(func(t *testing.T, key, value []byte, flags uint32, bind bool, pos uint32, x byte, raw []byte) {
		// Arbitrary bytes, under every plausible reading.
		for _, sf := range []uint32{flags | c.mask, c.mask} {
			v, got, err := c.AppendDecode(nil, key, bind, sf, raw)
			if err != nil {
				if ReasonOf(err) == 0 {
					t.Fatalf("refusal without a reason: %v", err)
				}
				continue
			}
			// Accepted: a plain envelope must be byte for byte what
			// the encoder writes for what it decoded to.
			if again, againSF := c.AppendEncode(nil, key, bind, got, v); codecOf(raw) == CodecNone && codecOf(again) == CodecNone {
				if againSF != sf || !bytes.Equal(again, raw) {
					t.Fatalf("accepted an envelope the encoder would not write: %x", raw)
				}
			}
		}

		stored, sf := c.AppendEncode(nil, key, bind, flags, value)
		v, got, err := c.AppendDecode(nil, key, bind, sf, stored)
		if err != nil || got != flags || !bytes.Equal(v, value) {
			t.Fatalf("round trip failed: %v", err)
		}
		if x == 0 {
			return
		}
		i := int(pos % uint32(len(stored)))
		bad := bytes.Clone(stored)
		bad[i] ^= x
		if v, _, err := c.AppendDecode(nil, key, bind, sf, bad); err == nil {
			t.Fatalf("byte %d of %d changed by %#02x and decoded to %d bytes", i, len(stored), x, len(v))
		}
		badSF := sf ^ uint32(x)<<(8*(pos%4))
		if _, _, err := c.AppendDecode(nil, key, bind, badSF, stored); err == nil {
			t.Fatalf("flags %#x changed to %#x and decoded", sf, badSF)
		}
	})
}

// FuzzRoundTrip checks, for any value, key, flags and compression settings,
// that decoding gives back the exact value and flags, that an envelope never
// costs more than its header, and that it never opens under another key.
func FuzzRoundTrip(f *testing.F) {
	addSeeds(f, func(fixture) []any { return []any{uint16(64), uint8(25)} })
	f.Fuzz(func(t *testing.T, key, value []byte, flags uint32, bind bool, minSize uint16, savings uint8) {
		c := newTestCodec(t, func(cfg *Config) {
			cfg.MinSize = int(minSize)
			cfg.MinSavings = float64(savings) / 255
		})
		prefix := []byte("prefix")
		stored, sf := c.AppendEncode(bytes.Clone(prefix), key, bind, flags, value)
		if !bytes.HasPrefix(stored, prefix) {
			t.Fatal("encode overwrote dst")
		}
		stored = stored[len(prefix):]
		if len(stored) > len(value)+headerLen(bind, len(value)) {
			t.Fatalf("%d bytes stored for %d: more than the header", len(stored), len(value))
		}
		v, got, err := c.AppendDecode(bytes.Clone(prefix), key, bind, sf, stored)
		if err != nil || got != flags || !bytes.Equal(v[len(prefix):], value) || !bytes.HasPrefix(v, prefix) {
			t.Fatalf("round trip failed: %v", err)
		}
		other := append(bytes.Clone(key), 0)
		if _, _, err := c.AppendDecode(nil, other, bind, sf, stored); err == nil {
			t.Fatal("decoded under another key")
		}
		if _, _, err := c.AppendDecode(nil, key, !bind, sf, stored); err == nil {
			t.Fatal("decoded with the wrong binding")
		}
	})
}
