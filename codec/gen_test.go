package codec

import (
	"encoding/binary"
	"math/rand/v2"
)

// seriesPayload returns size bytes of concatenated TSDB series entries
// (Prometheus index format v2), the value a Mimir or Thanos `S:` key holds:
// symbol references for a dozen labels, then chunk metas for a day of
// 30-minute chunks, then a CRC32. It compresses the way real ones do: label
// name refs repeat, chunk times and offsets are regular, value refs are not.
func seriesPayload(size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5e41e5))
	nameRefs := []uint32{3, 17, 41, 42, 88, 90, 131, 204, 377, 512, 640, 1021}
	out := make([]byte, 0, size+1024)
	var entry []byte
	for len(out) < size {
		entry = entry[:0]
		nLabels := 8 + r.IntN(5)
		entry = binary.AppendUvarint(entry, uint64(nLabels))
		base := uint32(r.IntN(150_000))
		for i := 0; i < nLabels; i++ {
			entry = binary.AppendUvarint(entry, uint64(nameRefs[i]))
			entry = binary.AppendUvarint(entry, uint64(base+uint32(r.IntN(2000))))
		}
		nChunks := 40 + r.IntN(9)
		entry = binary.AppendUvarint(entry, uint64(nChunks))
		mint := int64(1_735_689_600_000) + int64(r.IntN(15_000))
		ref := uint64(r.IntN(1 << 28))
		var prevMaxt int64
		for i := 0; i < nChunks; i++ {
			maxt := mint + 1_785_000 + int64(r.IntN(30))*1000
			size := uint64(120 + r.IntN(240))
			if i == 0 {
				entry = binary.AppendVarint(entry, mint)
				entry = binary.AppendUvarint(entry, uint64(maxt-mint))
				entry = binary.AppendUvarint(entry, ref)
			} else {
				entry = binary.AppendUvarint(entry, uint64(mint-prevMaxt))
				entry = binary.AppendUvarint(entry, uint64(maxt-mint))
				entry = binary.AppendVarint(entry, int64(size))
			}
			ref += size
			prevMaxt = maxt
			mint = maxt + 15_000
		}
		entry = binary.BigEndian.AppendUint32(entry, r.Uint32())
		out = binary.AppendUvarint(out, uint64(len(entry)))
		out = append(out, entry...)
	}
	return out[:size]
}

// postingsPayload returns size bytes (rounded down to whole references) of
// a raw postings list: strictly ascending series references as big-endian
// uint32, runs of near-constant gaps (each gap varies by up to 2) with
// occasional large jumps. Snappy alone saves nothing on it.
func postingsPayload(size int, seed uint64) []byte {
	return genPostings(size, seed, 3)
}

// postingsRuns is postingsPayload with gaps exactly constant within a run,
// the shape of the measurement (uvarints take 26 % of the raw size,
// snappy halves that): adjacent series entries of equal size.
func postingsRuns(size int, seed uint64) []byte {
	return genPostings(size, seed, 0)
}

// genPostings generates a raw postings list whose gaps vary by up to
// jitter-1 within a run; a run ends with a new gap (10 %) or a jump to
// another range of series (2 %).
func genPostings(size int, seed uint64, jitter int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9057))
	out := make([]byte, 0, size)
	ref := uint32(r.IntN(1 << 16))
	gap := uint32(1 + r.IntN(64))
	// Jumps shrink for lists long enough that they would overflow 32 bits
	// (over about 80,000 references).
	jump := min(1_000_000, (1<<32)/(size/4+1)*25)
	for len(out)+4 <= size {
		out = binary.BigEndian.AppendUint32(out, ref)
		switch x := r.IntN(100); {
		case x < 2:
			ref += uint32(10_000 + r.IntN(jump))
		case x < 12:
			gap = uint32(1 + r.IntN(64))
			ref += gap
		case jitter > 0:
			ref += gap + uint32(r.IntN(jitter))
		default:
			ref += gap
		}
	}
	return out
}

// mimirPostingsPayload returns a value shaped like Mimir's `P2:` entries,
// "dm" then a matchers key then a snappy block: already compressed, so it
// must be stored as it is.
func mimirPostingsPayload(size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0xd3))
	out := []byte("dm")
	matchers := `job="api"`
	out = binary.AppendUvarint(out, uint64(len(matchers)))
	out = append(out, matchers...)
	out = binary.AppendUvarint(out, 0)
	for len(out) < size {
		out = binary.LittleEndian.AppendUint64(out, r.Uint64())
	}
	return out[:size]
}
