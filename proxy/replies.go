package proxy

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// upstreamReply maps an error from an upstream request to the reply for
// the client and the request's outcome: a CLIENT_ERROR or SERVER_ERROR line
// the server sent where the proxy expected another reply (the meta
// commands of a read-modify-write) is relayed as it was sent; anything else
// is an upstream failure.
func upstreamReply(err error) ([]byte, stats.Outcome) {
	if line, ok := upstream.RelayedLine(err.Error()); ok {
		if bytes.Equal(line, wire.LineTooLarge) {
			// The server's item limit, not a failure of the server.
			return line, stats.OutcomeClientError
		}
		return line, stats.OutcomeUpstreamError
	}
	if upstream.IsTimeout(err) {
		return wire.LineUpstreamSlow, stats.OutcomeUpstreamError
	}
	return wire.LineUpstreamDown, stats.OutcomeUpstreamError
}
