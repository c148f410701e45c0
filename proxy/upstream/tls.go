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
func withTLS(dial func(context.Context, string, string) (net.Conn, error), cfg *tls.Config, connectTimeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if cfg == nil {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc, err := handshake(ctx, nc, nc, cfg)
		if err != nil {
			return nil, err
		}
		return &requestConn{Conn: tc, w: RequestRecords(tc)}, nil
	}
}

// tlsFor returns cfg for servers on host: with the host as the name the
// certificate must carry when cfg names none.
func tlsFor(cfg *tls.Config, host string) *tls.Config {
	if cfg == nil || cfg.ServerName != "" {
		return cfg
	}
	cfg = cfg.Clone()
	cfg.ServerName = host
	return cfg
}

// handshake runs a TLS client over via, which carries nc's bytes, and
// closes nc when the handshake fails.
func handshake(ctx context.Context, nc, via net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	tc := tls.Client(via, cfg)
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

// DialLoop connects to the server for an event loop, which moves the
// connection's bytes itself. It returns the plain connection and, when
// the servers speak TLS, a TLS client whose handshake is done, speaking
// through bridge(the plain connection): once the handshake is over, the
// loop feeds the bridge what arrives and writes what the client wrote to
// it. The loop writes requests to the client through RequestRecords. The connect timeout bounds the dial and the handshake together, as
// for every other connection to the server.
func (s *Server) DialLoop(ctx context.Context, bridge func(net.Conn) net.Conn) (net.Conn, *tls.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	nc, err := s.dialPlain(ctx, "", "")
	if err != nil || s.tls == nil {
		return nc, nil, err
	}
	tc, err := handshake(ctx, nc, bridge(nc), s.tls)
	if err != nil {
		return nil, nil, err
	}
	return nc, tc, nil
}
