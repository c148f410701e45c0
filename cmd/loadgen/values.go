package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
)

// appendValue appends version v of key's value: a printable header naming
// both, then a filler cut from cfg.pad at a place chosen by seed, key and
// version. The filler is raw binary and so contains CR and LF, which keeps
// servers honest about framing by length.
func appendValue(dst []byte, cfg *config, key int, v uint32) []byte {
	n := len(dst)
	dst = appendHeader(dst, cfg, key, v)
	return append(dst, filler(cfg, key, v, cfg.valueSize-(len(dst)-n))...)
}

// appendHeader appends the printable header of version v of key's value.
func appendHeader(dst []byte, cfg *config, key int, v uint32) []byte {
	dst = append(dst, cfg.keyPrefix...)
	dst = strconv.AppendInt(dst, int64(key), 10)
	dst = append(dst, '|', 'v')
	dst = strconv.AppendUint(dst, uint64(v), 10)
	return append(dst, '|')
}

// padSpan is the number of places in the pad a filler may start at.
const padSpan = 1 << 16

// newPad returns the bytes every filler is cut from: random bytes from a
// generator seeded by seed, padSpan more than the longest filler. Cutting
// fillers from one pad rather than generating each keeps checking a value
// down to a comparison of memory, so that loadgen, which shares the
// machine with the servers it measures, takes little CPU from them even
// when every get brings back hundreds of KiB.
func newPad(seed uint64, valueSize int) []byte {
	pad := make([]byte, valueSize+padSpan)
	s := seed
	for i := 0; i < len(pad); i += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], splitmix(&s))
		copy(pad[i:], b[:])
	}
	return pad
}

// filler returns the n filler bytes of version v of key's value.
func filler(cfg *config, key int, v uint32, n int) []byte {
	s := cfg.seed ^ uint64(key)<<32 ^ uint64(v)*0x9e3779b97f4a7c15
	off := int(splitmix(&s) % padSpan)
	return cfg.pad[off : off+n]
}

// isValue reports whether data is version v of key's value, as
// appendValue would write it.
func isValue(data []byte, cfg *config, key int, v uint32) bool {
	if len(data) != cfg.valueSize {
		return false
	}
	var hb [64]byte
	h := appendHeader(hb[:0], cfg, key, v)
	return bytes.HasPrefix(data, h) && bytes.Equal(data[len(h):], filler(cfg, key, v, len(data)-len(h)))
}

func splitmix(s *uint64) uint64 {
	*s += 0x9e3779b97f4a7c15
	z := *s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// parseHeader reads the key id and version from a value's header.
func parseHeader(data []byte, prefix string) (key int, v uint32, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(prefix))
	if !ok {
		return 0, 0, false
	}
	i := bytes.IndexByte(rest, '|')
	if i < 0 || i+2 > len(rest) || rest[i+1] != 'v' {
		return 0, 0, false
	}
	k, ok1 := parseUint(rest[:i])
	rest = rest[i+2:]
	j := bytes.IndexByte(rest, '|')
	if j < 0 {
		return 0, 0, false
	}
	ver, ok2 := parseUint(rest[:j])
	if !ok1 || !ok2 || k > math.MaxInt32 || ver > math.MaxUint32 {
		return 0, 0, false
	}
	return int(k), uint32(ver), true
}
