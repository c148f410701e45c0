package proxy

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// outcome is what became of one request, for counters and metrics.
type outcome uint8

const (
	outcomeHit outcome = iota
	outcomeMiss
	outcomeStored
	outcomeNotStored
	outcomeExists
	outcomeNotFound
	outcomeClientError
	outcomeUpstreamError
	outcomeOK
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	"hit", "miss", "stored", "not_stored", "exists", "not_found",
	"client_error", "upstream_error", "ok",
}

// replyOutcome sorts a reply line memcached sent to a command.
func replyOutcome(line []byte) outcome {
	switch {
	case bytes.Equal(line, wire.LineStored):
		return outcomeStored
	case bytes.Equal(line, wire.LineNotStored):
		return outcomeNotStored
	case bytes.Equal(line, wire.LineExists):
		return outcomeExists
	case bytes.Equal(line, wire.LineNotFound):
		return outcomeNotFound
	case isServerError(line):
		return outcomeUpstreamError
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR")), bytes.HasPrefix(line, []byte("ERROR")), bytes.Equal(line, wire.LineTooLarge):
		// memcached refused the client's own request.
		return outcomeClientError
	case len(line) >= 4 && (line[2] == ' ' || line[2] == '\r'):
		// A meta reply: its code, then flags.
		switch string(line[:2]) {
		case "HD":
			return outcomeStored
		case "NS":
			return outcomeNotStored
		case "EX":
			return outcomeExists
		case "NF":
			return outcomeNotFound
		case "EN":
			return outcomeMiss
		}
	}
	return outcomeOK // DELETED, TOUCHED, the number of incr and decr, VA
}

// isServerError reports whether memcached answered a command with a
// failure of its own, not a refusal of the request.
func isServerError(line []byte) bool {
	return bytes.HasPrefix(line, []byte("SERVER_ERROR")) && !bytes.Equal(line, wire.LineTooLarge)
}

// upstreamReply maps an error from an upstream request to the reply for
// the client and the request's outcome: a CLIENT_ERROR or SERVER_ERROR line
// the server sent where the proxy expected another reply (the meta
// commands of a read-modify-write) is relayed as it was sent; anything else
// is an upstream failure.
func upstreamReply(err error) ([]byte, outcome) {
	if line, ok := upstream.RelayedLine(err.Error()); ok {
		if bytes.Equal(line, wire.LineTooLarge) {
			// The server's item limit, not a failure of the server.
			return line, outcomeClientError
		}
		return line, outcomeUpstreamError
	}
	if upstream.IsTimeout(err) {
		return wire.LineUpstreamSlow, outcomeUpstreamError
	}
	return wire.LineUpstreamDown, outcomeUpstreamError
}
