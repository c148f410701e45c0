package proxy

import (
	"mcsidecar/proxy/internal/wire"
	"net"
	"time"
)

// overLimit reports whether --max-connections client connections are open
// already. The count is the one "stats" reports as curr_connections.
func (p *Proxy) overLimit() bool {
	limit := p.cfg.MaxConnections
	return limit > 0 && p.stats.CurrConns.Load() >= int64(limit)
}

// refuse turns away a connection over the limit the way memcached does when
// it is at -c: one error line, in plain text even on a TLS listener, and
// close. It runs on the accept loop, so the write may not block: a new
// socket's send buffer is empty, and the deadline guards the rest.
func (p *Proxy) refuse(nc net.Conn) {
	p.stats.ConnsRefused.Add(1)
	nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	nc.Write(wire.LineTooManyConns)
	nc.Close()
}
