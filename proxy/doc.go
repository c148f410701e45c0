// Package proxy is the memcached text-protocol server of the sidecar: it
// accepts client connections, parses every pipelined command, forwards each
// to the upstream memcached server that owns its key, and answers exactly
// as memcached would.
//
// Every client is served on an event loop (proxy/evloop). A request is
// framed, answered and written on its loop's goroutine; what it asks of
// memcached goes out on the loop's own connection to each server, together
// with the other clients' requests, and its reply is written in the
// client's request order. The files, by concern:
//
// The server and its operation:
//
//	proxy.go       Proxy: listening, accepting, the connection limit, Shutdown, Ready
//	config.go      Config and its flags; tls.go, the TLS flags of both sides
//	discovery.go   the --upstream names looked up in DNS, server sets swapped
//	metrics.go     the Prometheus collector; status.go, the status page's data
//	conn.go        what the server knows of one client, and reply helpers
//
// The event loops and a client on them:
//
//	loop.go        the loops' handler, each loop's state and free lists, the tick
//	loopclient.go  a client's bytes framed into requests and dispatched in order
//	output.go      what a client is owed, bounded; loopwrite.go, writing it out
//	looptls.go     a TLS client on a loop
//
// The way to memcached and back:
//
//	loopupstream.go  a loop's connection to a server, its queue of requests
//	loopreplies.go   replies read into chunks and matched to their requests
//	loopstep.go      a reply that does not fit its request: out of step, closed
//	loopanswer.go    a retrieval answered from where its hits lie, in arenas
//	loopaside.go     big retrievals opened (checked, rebuilt) on workers
//
// The commands:
//
//	keys.go        a key checked, matched and resolved once into its plan
//	loopsend.go    get and gets, the storage commands, delete, touch, incr, decr
//	loopgat.go     gat and gats; loopflush.go, flush_all
//	admin.go       version, verbosity, stats and the refusals made in place;
//	               statsub.go, the stats subcommands
//	loopmeta*.go, meta*.go   the meta commands: requests, replies, mg, ms, ma
//	envelope.go    values enveloped and opened (codec); loopmodify.go, the
//	               read-modify-write of an enveloped value (append, incr, ...)
//
// Zones and the local tier:
//
//	loopzones.go   writes to every zone or zone by zone, reads zone after zone, fills
//	localtier.go   the tier asked and filled, and writes ordered against both
package proxy
