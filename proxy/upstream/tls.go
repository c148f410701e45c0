package upstream

import (
	"context"
	"crypto/tls"
	"net"
	"time"
)

// withTLS wraps dial so that every upstream connection, gomemcache's and
// the raw pool's alike, completes a TLS handshake before it is used. The
// handshake is part of connecting: connectTimeout bounds the dial and the
// handshake together (gomemcache's own dial context allows the longer
// upstream timeout). Without a server name the certificate must name the
// host being dialed.
func withTLS(dial func(context.Context, string, string) (net.Conn, error), cfg *tls.Config, host string, connectTimeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if cfg == nil {
		return dial
	}
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			// No connection could be made, as when the dial itself
			// fails: a refused certificate is a connect error, counted
			// towards ejecting the server, and a handshake that ran out
			// of time stays a timeout (OpError asks its Err).
			return nil, &net.OpError{Op: "dial", Net: nc.RemoteAddr().Network(), Addr: nc.RemoteAddr(), Err: err}
		}
		return tc, nil
	}
}
