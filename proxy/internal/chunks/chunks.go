// Package chunks is the pool of byte arrays an event loop reads
// memcached's replies into. Many requests' replies share a chunk, each
// referring to it until its client has it, and the chunk goes back to the
// pool when the last lets go. Only a loop's own goroutine uses its pool,
// so nothing here locks.
package chunks

import (
	"math/bits"
	"slices"
)

// Size is a chunk's size. Measured on the comparison's load 3 (100-key
// gets of 3 KiB values over four servers), 512 KiB chunks took 10 % fewer
// reads than 256 KiB ones and moved fewer replies; 1 MiB ones did no
// better.
const Size = 512 << 10

// What a pool keeps of what is given back: up to kept chunks of Size, and
// longer ones, none over KeepMax, up to longBytes in all. A reply of long
// values is read into a chunk of its size; one allocated for each would
// be zeroed and its pages faulted in each time, and be cold in the CPU's
// cache when written to the client. The longer ones are kept apart, so
// that a burst of short replies does not leave no room for long ones.
const (
	kept      = 32
	longBytes = 16 << 20
	KeepMax   = 4 << 20
	// sharesKept bounds the free list of Shares.
	sharesKept = 1024
)

// A Share is a chunk and how many refer to it: the requests whose replies
// are in it, and the connection that reads into it.
type Share struct {
	Buf  []byte
	Refs int
}

// Pool is one loop's chunks. The zero value is ready to use.
type Pool struct {
	chunks [][]byte // of Size bytes, no reply in them
	long   [][]byte // longer ones, longKept bytes in all
	// longKept is the bytes of long; made, of the chunks allocated.
	longKept, made int
	shares         []*Share
}

// Get returns a chunk of at least n bytes, referred to once: of those
// given back, the smallest large enough, the last one given back of
// those, whose bytes are the likeliest to be in the CPU's cache. A chunk
// over Size is a power of two in size, so that replies of about one size
// take turns in one.
func (p *Pool) Get(n int) *Share {
	n = max(n, Size)
	if n > Size && n <= KeepMax {
		n = 1 << bits.Len(uint(n-1))
	}
	if k := len(p.chunks); n == Size && k > 0 {
		b := p.chunks[k-1]
		p.chunks[k-1] = nil
		p.chunks = p.chunks[:k-1]
		return p.share(b)
	}
	best := -1
	for k, b := range p.long {
		if cap(b) >= n && (best < 0 || cap(b) <= cap(p.long[best])) {
			best = k
		}
	}
	if best < 0 {
		p.made += n
		return p.share(make([]byte, 0, n))
	}
	b := p.long[best]
	p.long = slices.Delete(p.long, best, best+1)
	p.longKept -= cap(b)
	return p.share(b)
}

// Adopt returns a Share, referred to once, of buf, an array the pool did
// not make (a reply that outgrew its chunk was appended into a larger
// one). It is kept when given back if it has a chunk's size.
func (p *Pool) Adopt(buf []byte) *Share { return p.share(buf[:0]) }

// share wraps b in a Share from the free list.
func (p *Pool) share(b []byte) *Share {
	var sh *Share
	if n := len(p.shares); n > 0 {
		sh = p.shares[n-1]
		p.shares[n-1] = nil
		p.shares = p.shares[:n-1]
	} else {
		sh = new(Share)
	}
	sh.Buf, sh.Refs = b, 1
	return sh
}

// Release drops one reference to sh, and takes its chunk back once no
// reply in it is referred to any more.
func (p *Pool) Release(sh *Share) {
	if sh.Refs--; sh.Refs > 0 {
		return
	}
	// A reply that outgrew its chunk may have moved to a smaller array
	// (see Adopt): only whole chunks are kept, or one would sit on top.
	switch b, n := sh.Buf, cap(sh.Buf); {
	case n == Size && len(p.chunks) < kept:
		p.chunks = append(p.chunks, b[:0])
	case n > Size && n <= KeepMax && p.longKept+n <= longBytes:
		p.long = append(p.long, b[:0])
		p.longKept += n
	}
	*sh = Share{}
	if len(p.shares) < sharesKept {
		p.shares = append(p.shares, sh)
	}
}

// Made returns the bytes of the chunks the pool has allocated.
func (p *Pool) Made() int { return p.made }
