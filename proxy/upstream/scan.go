package upstream

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
)

// This file reads the replies of a connection that many clients' requests
// share. memcached answers them in order, so each reply is read as the
// reply its request awaits, and a reply that breaks the protocol, or does
// not fit the request, is an OutOfStepError: the connection is closed,
// never read on.

// ReplyScan reads one reply at a time into Acc, and tells when it is
// whole: a retrieval's VALUE blocks up to END, the replies to a request's
// mg lines, or one line. The caller may read a long value's bytes straight
// into Acc's spare capacity (Need says how many are still to come); Feed
// sees that they are already in place.
type ReplyScan struct {
	Acc  []byte
	line int // where the line being read starts in Acc
	Need int // bytes of a value still to come, with their CRLF
	mg   int // replies to mg lines read whole
	// Vals are the VALUE lines of a retrieval's reply read so far. The
	// array serves the next reply (see Spare): what the last one held
	// stays valid until the next Feed.
	Vals []ValueAt
}

// ValueAt is one VALUE line of a reply as the scan read it: where it
// begins in the reply, how long it and its key are, and what else it
// says, so that matching the reply to its keys does not parse it again.
// It holds offsets, not slices: the reply may move to a larger chunk as
// it grows.
type ValueAt struct {
	At, Line, KeyLen int
	Flags            uint32
	Size             int
	CAS              uint64
	HasCAS           bool
}

// KeyIn returns the line's key in reply.
func (v *ValueAt) KeyIn(reply []byte) []byte {
	return reply[v.At+len(wire.LineValue) : v.At+len(wire.LineValue)+v.KeyLen]
}

// End returns where the line's VALUE block (the line, the value and its
// CRLF) ends in the reply.
func (v *ValueAt) End() int { return v.At + v.Line + v.Size + 2 }

// Block returns the line's VALUE block in reply.
func (v *ValueAt) Block(reply []byte) []byte {
	end := v.End()
	return reply[v.At:end:end]
}

// Next starts the next reply where the one read ends.
func (r *ReplyScan) Next() {
	*r = ReplyScan{Acc: r.Acc[len(r.Acc):], Vals: r.Spare()}
}

// valsKeep is the most VALUE lines whose array a scan keeps for the
// next reply.
const valsKeep = 1024

// Spare returns Vals emptied, for the next reply, unless it grew past
// valsKeep.
func (r *ReplyScan) Spare() []ValueAt {
	if cap(r.Vals) > valsKeep {
		return nil
	}
	return r.Vals[:0]
}

// inPlace reports whether data begins where acc ends: read there by the caller.
func (r *ReplyScan) inPlace(data []byte) bool {
	n := len(r.Acc)
	return len(data) > 0 && cap(r.Acc) > n && &r.Acc[:n+1][n] == &data[0]
}

// Want is the reply a request awaits.
type Want struct {
	// Store: a command of one key, answered by one line of the family
	// Expect, or for ma and mg by a line and the value it announces.
	// Otherwise a retrieval: VALUE blocks up to END, or with MetaGets
	// set, the replies to that many mg lines, one each.
	Store    bool
	Expect   wire.Reply
	MetaGets int
}

// Feed takes bytes of the reply a request awaits (w) from data. It returns
// how many it took, whether the reply is whole, and, when it breaks the
// protocol, why.
func (r *ReplyScan) Feed(data []byte, w Want) (took int, whole bool, bad *OutOfStepError) {
	retrieval := !w.Store
	for took < len(data) {
		if r.Need > 0 {
			n := min(r.Need, len(data)-took)
			if r.inPlace(data[took:]) {
				r.Acc = r.Acc[:len(r.Acc)+n] // read into place (room)
			} else {
				r.Acc = append(r.Acc, data[took:took+n]...)
			}
			took += n
			if r.Need -= n; r.Need > 0 {
				return took, false, nil
			}
			if !bytes.HasSuffix(r.Acc, wire.CRLF) {
				return took, false, OutOfStep(ReasonMalformed, r.Acc[len(r.Acc)-2:])
			}
			r.line = len(r.Acc)
			if w.Store {
				return took, true, nil // an incr's number
			}
			if w.MetaGets > 0 {
				if r.mg++; r.mg == w.MetaGets {
					return took, true, nil
				}
			}
			continue
		}
		i := bytes.IndexByte(data[took:], '\n')
		if i < 0 {
			r.Acc = append(r.Acc, data[took:]...)
			if len(r.Acc)-r.line > wire.LineLimit {
				return len(data), false, OutOfStep(ReasonMalformed, r.Acc[r.line:])
			}
			return len(data), false, nil
		}
		r.Acc = append(r.Acc, data[took:took+i+1]...)
		took += i + 1
		line := r.Acc[r.line:]
		if len(line) > wire.LineLimit {
			return took, false, OutOfStep(ReasonMalformed, line) // no reply line is this long
		}
		if w.MetaGets > 0 {
			if bytes.HasPrefix(line, wire.LineMetaValue) {
				size, _, err := ParseMetaValue(line)
				if err != nil {
					return took, false, OutOfStep(ReasonMalformed, line)
				}
				r.Need = size + 2
				continue
			}
			// EN, or an error line for one key.
			if !wire.ReplyMetaGet.Fits(line) {
				return took, false, Unfitting(line)
			}
			r.line = len(r.Acc)
			if r.mg++; r.mg == w.MetaGets {
				return took, true, nil
			}
			continue
		}
		switch {
		case w.Expect == wire.ReplyMetaArith:
			if n, ok := wire.ArithLine(line); ok {
				r.Need = n // the number follows
				continue
			}
		case w.Expect == wire.ReplyMetaGet && bytes.HasPrefix(line, wire.LineMetaValue):
			// An mg's hit: its value follows.
			n, ok := wire.MetaValueBlock(line, MaxValueLen)
			if !ok {
				return took, false, OutOfStep(ReasonMalformed, line)
			}
			r.Need = n
			continue
		}
		if !retrieval || !bytes.HasPrefix(line, wire.LineValue) {
			return took, true, nil
		}
		v, ok := wire.ParseValue(line)
		if !ok || v.Size > MaxValueLen {
			return took, false, OutOfStep(ReasonMalformed, line)
		}
		r.Vals = append(r.Vals, ValueAt{At: r.line, Line: len(line), KeyLen: len(v.Key), Flags: v.Flags, Size: v.Size, CAS: v.CAS, HasCAS: v.HasCAS})
		r.Need = v.Size + 2
	}
	return took, false, nil
}

// Unfitting is the error of a reply line that does not fit its request:
// memcached's "out of memory", which may have dropped replies before it,
// or any other line out of place.
func Unfitting(line []byte) *OutOfStepError {
	if wire.OutOfStep(line) {
		return OutOfStep(ReasonOutOfMemory, line)
	}
	return OutOfStep(ReasonUnexpected, line)
}
