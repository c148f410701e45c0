package upstream

import (
	"errors"
	"fmt"
	"log/slog"
)

// Reason is why a connection was found out of step with its requests, the
// "reason" label of the protocol error metric.
type Reason uint8

// Reasons a connection is out of step.
const (
	// ReasonOutOfMemory: memcached's "SERVER_ERROR out of memory …",
	// after which it may have dropped replies owed (see wire.OutOfStep).
	ReasonOutOfMemory Reason = iota
	// ReasonUnexpected: a reply outside the family of the request in its
	// place (a VALUE block answering a set, a number answering a touch).
	ReasonUnexpected
	// ReasonUnaskedKey: a VALUE block for a key the retrieval in its
	// place did not ask for, or not in the order it asked.
	ReasonUnaskedKey
	// ReasonMalformed: a reply that cannot be read: a VALUE line that
	// does not parse, a data block not ended by CRLF, a line too long.
	ReasonMalformed
	NumReasons
)

var reasonNames = [NumReasons]string{"out_of_memory", "unexpected_reply", "unasked_key", "malformed"}

// String returns the reason's metric label.
func (r Reason) String() string { return reasonNames[r] }

// OutOfStepError is a reply that does not answer the request in its place.
// The connection it came on is closed at once and nothing read after it
// reaches a client: every request still pending on it fails with this
// error.
type OutOfStepError struct {
	Reason Reason
	Line   string // the start of the reply, for the log
}

// outOfStepQuote is the most bytes of the reply an error quotes: enough
// for memcached's error lines, not a client's value.
const outOfStepQuote = 64

// OutOfStep returns the error for a connection out of step at line.
func OutOfStep(reason Reason, line []byte) *OutOfStepError {
	return &OutOfStepError{Reason: reason, Line: string(line[:min(len(line), outOfStepQuote)])}
}

// Error quotes memcached's line last, so that a SERVER_ERROR it sent is
// relayed to the clients whose requests fail (see RelayedLine).
func (e *OutOfStepError) Error() string {
	return fmt.Sprintf("upstream connection out of step (%s), closed: memcached replied: %q", e.Reason, e.Line)
}

// IsOutOfStep reports whether err is a connection found out of step.
func IsOutOfStep(err error) bool {
	var e *OutOfStepError
	return errors.As(err, &e)
}

// outOfStep counts and logs a connection to the server found out of step.
func (s *serverStats) outOfStep(err error, log *slog.Logger) {
	var e *OutOfStepError
	if !errors.As(err, &e) {
		return
	}
	s.protocol[e.Reason].Add(1)
	if log != nil {
		log.Warn("upstream connection out of step with its requests: closed, its pending requests failed",
			"server", s.name, "reason", e.Reason.String(), "reply", e.Line)
	}
}

// OutOfStep counts and logs a connection to the server found out of step,
// when err is an *OutOfStepError.
func (s *Server) OutOfStep(err error) { s.up.outOfStep(err, s.health.log) }

// ProtocolErrors returns how many of the server's connections were found
// out of step for reason r.
func (s *Server) ProtocolErrors(r Reason) uint64 { return s.up.protocol[r].Load() }
