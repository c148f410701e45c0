package stats

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
)

// Outcome is what became of one request, for counters and metrics.
type Outcome uint8

const (
	OutcomeHit Outcome = iota
	OutcomeMiss
	OutcomeStored
	OutcomeNotStored
	OutcomeExists
	OutcomeNotFound
	OutcomeClientError
	OutcomeUpstreamError
	OutcomeOK
	NumOutcomes
)

var OutcomeNames = [NumOutcomes]string{
	"hit", "miss", "stored", "not_stored", "exists", "not_found",
	"client_error", "upstream_error", "ok",
}

// ReplyOutcome sorts a reply line memcached sent to a command.
func ReplyOutcome(line []byte) Outcome {
	switch {
	case bytes.Equal(line, wire.LineStored):
		return OutcomeStored
	case bytes.Equal(line, wire.LineNotStored):
		return OutcomeNotStored
	case bytes.Equal(line, wire.LineExists):
		return OutcomeExists
	case bytes.Equal(line, wire.LineNotFound):
		return OutcomeNotFound
	case IsServerError(line):
		return OutcomeUpstreamError
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR")), bytes.HasPrefix(line, []byte("ERROR")), bytes.Equal(line, wire.LineTooLarge):
		// memcached refused the client's own request.
		return OutcomeClientError
	case len(line) >= 4 && (line[2] == ' ' || line[2] == '\r'):
		// A meta reply: its code, then flags.
		switch string(line[:2]) {
		case "HD":
			return OutcomeStored
		case "NS":
			return OutcomeNotStored
		case "EX":
			return OutcomeExists
		case "NF":
			return OutcomeNotFound
		case "EN":
			return OutcomeMiss
		}
	}
	return OutcomeOK // DELETED, TOUCHED, the number of incr and decr, VA
}

// IsServerError reports whether memcached answered a command with a
// failure of its own, not a refusal of the request.
func IsServerError(line []byte) bool {
	return bytes.HasPrefix(line, []byte("SERVER_ERROR")) && !bytes.Equal(line, wire.LineTooLarge)
}
