package codec

import "errors"

// Reason says why a stored envelope was refused. Every reason means the
// same thing to a client, a miss; the proxy counts them apart so an operator
// can tell damage (checksum) from collisions (key) and from a rolling upgrade
// (version, codec).
type Reason uint8

// The reasons a stored envelope is refused, in the order AppendDecode
// checks them.
const (
	// ReasonBadHeader: the item is not an envelope this codec can parse (the
	// reserved flags bit is missing, the envelope is too short, or its
	// decoded length does not parse).
	ReasonBadHeader Reason = iota + 1
	// ReasonBadVersion: the envelope's format version is not one this
	// codec reads.
	ReasonBadVersion
	// ReasonKeyMismatch: the envelope was written for another client key.
	ReasonKeyMismatch
	// ReasonChecksumMismatch: the stored bytes, the upstream flags or (for
	// an envelope without a stored binding) the key differ from what was
	// written.
	ReasonChecksumMismatch
	// ReasonUnknownCodec: an intact envelope names a codec this version
	// does not know, as written by a newer version.
	ReasonUnknownCodec
	// ReasonLengthMismatch: the recorded decoded length does not fit the
	// payload.
	ReasonLengthMismatch
	// ReasonDecodeError: the codec could not decode an intact payload.
	ReasonDecodeError
)

var reasonNames = [...]string{
	ReasonBadHeader:        "bad_header",
	ReasonBadVersion:       "bad_version",
	ReasonKeyMismatch:      "key_mismatch",
	ReasonChecksumMismatch: "checksum_mismatch",
	ReasonUnknownCodec:     "unknown_codec",
	ReasonLengthMismatch:   "length_mismatch",
	ReasonDecodeError:      "decode_error",
}

// String returns the reason as a metric label value, such as "key_mismatch".
func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return "unknown"
}

// Damaged reports whether an item refused for this reason can never be read
// by any version of the codec, so deleting it upstream (DeleteCorrupt) frees
// memory and hurts no one. An item refused for its version or codec was
// written by a newer version, and one refused for its key is intact and
// belongs to another client key: those are left in place.
func (r Reason) Damaged() bool {
	switch r {
	case ReasonBadHeader, ReasonChecksumMismatch, ReasonLengthMismatch, ReasonDecodeError:
		return true
	}
	return false
}

// Reasons lists every reason, so a caller can create each metric label at
// zero.
func Reasons() []Reason {
	rs := make([]Reason, 0, len(reasonNames)-1)
	for r := ReasonBadHeader; int(r) < len(reasonNames); r++ {
		rs = append(rs, r)
	}
	return rs
}

// Error is a refused envelope. AppendDecode returns one of the Err values
// below, never a new one, so refusing costs no allocation and errors.Is
// works.
type Error struct {
	Reason Reason
}

func (e *Error) Error() string { return "codec: envelope refused: " + e.Reason.String() }

// The errors AppendDecode returns, one per Reason.
var (
	ErrBadHeader        = &Error{ReasonBadHeader}
	ErrBadVersion       = &Error{ReasonBadVersion}
	ErrKeyMismatch      = &Error{ReasonKeyMismatch}
	ErrChecksumMismatch = &Error{ReasonChecksumMismatch}
	ErrUnknownCodec     = &Error{ReasonUnknownCodec}
	ErrLengthMismatch   = &Error{ReasonLengthMismatch}
	ErrDecodeError      = &Error{ReasonDecodeError}
)

// ReasonOf returns the reason carried by err, or 0 when err is not a
// refused envelope.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return 0
}
