package codec

import (
	"bytes"
	"encoding/binary"
	"math"
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
		// The postings-aware encoder, so that the raw postings fixture
		// seeds a codec-2 envelope.
		stored, _ := c.AppendEncodePostings(nil, fx.key, fx.bind, fx.flags, fx.value)
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
				fuzzPostingsPayload(t, c, key, bind, sf, raw)
				continue
			}
			// Nothing is accepted without its checksum.
			if checksum(got, key, raw, nil) != binary.LittleEndian.Uint32(raw[crcOffset:]) {
				t.Fatalf("accepted an envelope whose checksum does not match: %x", raw)
			}
			// What was accepted, the header announced.
			if n, f, ok := c.DecodedLen(sf, raw); !ok || n != len(v) || f != got {
				t.Fatalf("DecodedLen %d %d %v, decoded %d bytes, flags %d", n, f, ok, len(v), got)
			}
			// Accepted: a plain envelope must be byte for byte what
			// the encoder writes for what it decoded to.
			if again, againSF := c.AppendEncode(nil, key, bind, got, v); codecOf(raw) == CodecNone && codecOf(again) == CodecNone {
				if againSF != sf || !bytes.Equal(again, raw) {
					t.Fatalf("accepted an envelope the encoder would not write: %x", raw)
				}
			}
		}

		// Both encoders: a raw postings value takes codec 2 from the
		// second.
		for _, encode := range []func(dst, key []byte, bindKey bool, flags uint32, value []byte) ([]byte, uint32){c.AppendEncode, c.AppendEncodePostings} {
			stored, sf := encode(nil, key, bind, flags, value)
			v, got, err := c.AppendDecode(nil, key, bind, sf, stored)
			if err != nil || got != flags || !bytes.Equal(v, value) {
				t.Fatalf("round trip failed: %v", err)
			}
			if x == 0 {
				continue
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
		}
	})
}

// fuzzPostingsPayload reads arbitrary stored bytes as a codec-2 and a codec-3 envelope
// with a valid checksum, as no random input would be, so that the fuzzer
// reaches the postings decoder: it must never panic, and what it accepts
// must be a postings list of the recorded length.
func fuzzPostingsPayload(t *testing.T, c *Codec, key []byte, bind bool, sf uint32, raw []byte) {
	if len(raw) < minEnvelope {
		return
	}
	for _, id := range []byte{CodecPostings, CodecPostingsPacked} {
		s := bytes.Clone(raw)
		s[0] = version<<versionShift | s[0]&(bitBound|bitReserved) | id
		s = reseal(c, sf, key, s)
		v, _, err := c.AppendDecode(nil, key, bind, sf, s)
		if err != nil {
			if ReasonOf(err) == 0 {
				t.Fatalf("refusal without a reason: %v", err)
			}
			continue
		}
		if _, ok := detectPostings(v); !ok {
			t.Fatalf("codec %d decoded to %x, which is no postings list", id, v)
		}
	}
}

// FuzzPostingsRoundTrip checks the postings codec on arbitrary bytes and on
// lists built from them (the bytes read as uvarint gaps) in each layout:
// every value comes back byte for byte, a value the detector accepts is
// written with exactly the stream length it counted, the envelope is never
// longer than the generic codec's, and a value it refuses is stored exactly
// as the generic codec stores it.
func FuzzPostingsRoundTrip(f *testing.F) {
	for i, v := range [][]byte{postingsPayload(400, 1), postingsRuns(600, 2), postingsPayload(40, 3), {0, 0, 0, 0}, {0, 0, 0, 1, 0, 0, 0, 7}} {
		f.Add(v, byte(i), i%2 == 0, uint32(i))
	}
	c := newTestCodec(f, func(cfg *Config) { cfg.MinSize = 0 })
	f.Fuzz(func(t *testing.T, data []byte, layout byte, bind bool, flags uint32) {
		key := testKey
		if bind {
			key = rewrittenKey
		}
		list := listFromGaps(data, layout%3)
		if _, ok := detectPostings(list); !ok && len(list) > 0 {
			t.Fatalf("built list %x not detected", list)
		}
		for _, v := range [][]byte{data, list} {
			pl, isList := detectPostings(v)
			if isList {
				stream := make([]byte, pl.streamLen)
				if w := putStream(stream, v, pl.layout); w != pl.streamLen {
					t.Fatalf("stream %d bytes, detection counted %d", w, pl.streamLen)
				}
			}
			stored, sf := c.AppendEncodePostings(nil, key, bind, flags, v)
			generic, genericSF := c.AppendEncode(nil, key, bind, flags, v)
			if len(stored) > len(generic) || sf != genericSF {
				t.Fatalf("postings-aware envelope of %d bytes, generic %d", len(stored), len(generic))
			}
			if !isList && !bytes.Equal(stored, generic) {
				t.Fatalf("a value that is no list was stored differently")
			}
			got, gotFlags, err := c.AppendDecode(nil, key, bind, sf, stored)
			if err != nil || gotFlags != flags || !bytes.Equal(got, v) {
				t.Fatalf("round trip of %x failed: %v", v, err)
			}
		}
	})
}

// listFromGaps builds a strictly ascending list in a layout (tsdb, u32,
// u64) from data read as uvarints: the first reference, then each gap less
// one. It stops at 4096 references or where a reference would overflow.
func listFromGaps(data []byte, layout byte) []byte {
	top := uint64(math.MaxUint32)
	if layout == layoutU64 {
		top = math.MaxUint64
	}
	var refs []uint64
	var prev uint64
	for len(data) > 0 && len(refs) < 4096 {
		d, k := binary.Uvarint(data)
		if k <= 0 {
			break
		}
		data = data[k:]
		x := d
		if len(refs) > 0 {
			x = prev + d + 1
			if d >= top || x < prev || x > top {
				break
			}
		} else if x > top {
			break
		}
		refs = append(refs, x)
		prev = x
	}
	var out []byte
	switch layout {
	case layoutTSDB:
		out = binary.BigEndian.AppendUint32(out, uint32(len(refs)))
		fallthrough
	case layoutU32:
		for _, r := range refs {
			out = binary.BigEndian.AppendUint32(out, uint32(r))
		}
	default:
		for _, r := range refs {
			out = binary.BigEndian.AppendUint64(out, r)
		}
	}
	return out
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
		if n, f, ok := c.DecodedLen(sf, stored); c.IsEnveloped(sf) && (!ok || n != len(value) || f != flags) {
			t.Fatalf("DecodedLen %d %d %v of a value of %d bytes, flags %d", n, f, ok, len(value), flags)
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
