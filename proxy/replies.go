package proxy

import (
	"bytes"

	"mcsidecar/proxy/upstream"
)

// Fixed replies, written exactly as memcached 1.6 writes them.
var (
	replyStored         = []byte("STORED\r\n")
	replyNotStored      = []byte("NOT_STORED\r\n")
	replyExists         = []byte("EXISTS\r\n")
	replyNotFound       = []byte("NOT_FOUND\r\n")
	replyDeleted        = []byte("DELETED\r\n")
	replyTouched        = []byte("TOUCHED\r\n")
	replyEnd            = []byte("END\r\n")
	replyOK             = []byte("OK\r\n")
	replyReset          = []byte("RESET\r\n")
	replyError          = []byte("ERROR\r\n")
	replyBadFormat      = []byte("CLIENT_ERROR bad command line format\r\n")
	replyBadChunk       = []byte("CLIENT_ERROR bad data chunk\r\n")
	replyBadExptime     = []byte("CLIENT_ERROR invalid exptime argument\r\n")
	replyBadDelta       = []byte("CLIENT_ERROR invalid numeric delta argument\r\n")
	replyBadDeleteUsage = []byte("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n")
	replyTooLarge       = []byte("SERVER_ERROR object too large for cache\r\n")
	replyNonNumeric     = []byte("CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")
	replyTooManyConns   = []byte("ERROR Too many open connections\r\n")
	// The proxy's own: a read-modify-write of an enveloped item lost the
	// race against other writes rmwAttempts times in a row.
	replyContended    = []byte("SERVER_ERROR too many concurrent updates\r\n")
	replyUpstreamDown = []byte("SERVER_ERROR upstream unavailable\r\n")
	replyUpstreamSlow = []byte("SERVER_ERROR upstream timeout\r\n")
	replyValue        = []byte("VALUE ")
	replyStat         = []byte("STAT ")
	crlf              = []byte("\r\n")
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
	case bytes.Equal(line, replyStored):
		return outcomeStored
	case bytes.Equal(line, replyNotStored):
		return outcomeNotStored
	case bytes.Equal(line, replyExists):
		return outcomeExists
	case bytes.Equal(line, replyNotFound):
		return outcomeNotFound
	case isServerError(line):
		return outcomeUpstreamError
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR")), bytes.HasPrefix(line, []byte("ERROR")), bytes.Equal(line, replyTooLarge):
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
	return bytes.HasPrefix(line, []byte("SERVER_ERROR")) && !bytes.Equal(line, replyTooLarge)
}

// upstreamReply maps an error from an upstream request to the reply for
// the client and the request's outcome: a CLIENT_ERROR or SERVER_ERROR line
// the server sent where the proxy expected another reply (the meta
// commands of a read-modify-write) is relayed as it was sent; anything else
// is an upstream failure.
func upstreamReply(err error) ([]byte, outcome) {
	if line, ok := upstream.RelayedLine(err.Error()); ok {
		if bytes.Equal(line, replyTooLarge) {
			// The server's item limit, not a failure of the server.
			return line, outcomeClientError
		}
		return line, outcomeUpstreamError
	}
	if upstream.IsTimeout(err) {
		return replyUpstreamSlow, outcomeUpstreamError
	}
	return replyUpstreamDown, outcomeUpstreamError
}
