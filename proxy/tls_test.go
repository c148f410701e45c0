package proxy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"mcsidecar/proxy/upstream"
)

// testPKI is a CA and the files of certificates it signed, written for a
// test: PEM certificates and PKCS #8 keys, readable by a memcached that
// runs as nobody.
type testPKI struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPath string
}

func newTestPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcsidecar-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pki := &testPKI{dir: dir, caCert: cert, caKey: key, caPath: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, pki.caPath, "CERTIFICATE", der)
	return pki
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// issue signs a certificate for 127.0.0.1 and localhost, for servers or
// clients, and returns the paths of its certificate and key.
func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPath, keyPath string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath = filepath.Join(p.dir, name+".pem")
	keyPath = filepath.Join(p.dir, name+"-key.pem")
	writePEM(t, certPath, "CERTIFICATE", der)
	writePEM(t, keyPath, "PRIVATE KEY", pkcs8)
	return certPath, keyPath
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tlsDial connects to addr with TLS as a client trusting ca, showing the
// given certificate if any.
func tlsDial(t *testing.T, addr, caPath, certPath, keyPath string) (*tls.Conn, error) {
	t.Helper()
	roots, err := loadCAs(caPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if certPath != "" {
		cert, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// roundTrip sends req and reads one reply line, or says why it could not.
func roundTrip(c net.Conn, req string) string {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return "write: " + err.Error()
	}
	reply, err := readReply(bufio.NewReader(c))
	if err != nil {
		return reply + " (" + err.Error() + ")"
	}
	return reply
}

// TestTLSClients serves clients over TLS with client certificates required,
// in front of a real memcached: a client with a certificate the CA signed
// sets and gets; one without a certificate, one with a certificate of
// another CA and one speaking plain TCP get no reply.
func TestTLSClients(t *testing.T) {
	pki := newTestPKI(t, "clients")
	cert, key := pki.issue(t, "proxy", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := pki.issue(t, "store-gateway", x509.ExtKeyUsageClientAuth)
	other := newTestPKI(t, "other")
	otherCert, otherKey := other.issue(t, "intruder", x509.ExtKeyUsageClientAuth)

	cfg := testConfig(startMemcached(t))
	cfg.TLS = ServerTLS{CertPath: cert, KeyPath: key, ClientCAPath: pki.caPath}
	_, addr := startProxy(t, cfg)

	c, err := tlsDial(t, addr, pki.caPath, clientCert, clientKey)
	if err != nil {
		t.Fatalf("a client with a certificate of the CA: %v", err)
	}
	if got := roundTrip(c, "set tls 7 0 5\r\nhello\r\n"); got != "STORED\r\n" {
		t.Fatalf("set over TLS answered %q", got)
	}
	if got := roundTrip(c, "get tls\r\n"); got != "VALUE tls 7 5\r\nhello\r\nEND\r\n" {
		t.Fatalf("get over TLS answered %q", got)
	}

	for _, tc := range []struct{ name, cert, key string }{
		{"no certificate", "", ""},
		{"a certificate of another CA", otherCert, otherKey},
	} {
		// With TLS 1.3 the client's handshake may finish before the
		// server has judged its certificate; then the first read fails.
		c, err := tlsDial(t, addr, pki.caPath, tc.cert, tc.key)
		if err == nil {
			if got := roundTrip(c, "get tls\r\n"); strings.Contains(got, "VALUE") || !strings.Contains(got, "(") {
				t.Errorf("a client with %s got %q", tc.name, got)
			}
		}
	}

	plain := dial(t, addr)
	if got := roundTrip(plain, "get tls\r\n"); strings.Contains(got, "VALUE") || strings.Contains(got, "END") {
		t.Errorf("a plain TCP client got %q", got)
	}
}

// TestTLSClientsWithoutClientCA serves TLS to any client when no client CA
// is given.
func TestTLSClientsWithoutClientCA(t *testing.T) {
	pki := newTestPKI(t, "clients")
	cert, key := pki.issue(t, "proxy", x509.ExtKeyUsageServerAuth)
	cfg := testConfig(startMemcached(t))
	cfg.TLS = ServerTLS{CertPath: cert, KeyPath: key}
	_, addr := startProxy(t, cfg)
	c, err := tlsDial(t, addr, pki.caPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(c, "version\r\n"); got != "VERSION mcsidecar-test\r\n" {
		t.Fatalf("version over TLS answered %q", got)
	}
}

// TestTLSUpstream runs memcached itself with TLS, requiring a client
// certificate, and sends every kind of upstream request through the
// proxy's TLS connections: sets and deletes (gomemcache's pool), gets
// (the retrieval pool) and an append to an enveloped item (meta commands
// on the retrieval pool). A proxy without upstream TLS, or with a CA that
// did not sign the server, gets nothing from it.
func TestTLSUpstream(t *testing.T) {
	pki := newTestPKI(t, "memcached")
	srvCert, srvKey := pki.issue(t, "memcached", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := pki.issue(t, "mcsidecar", x509.ExtKeyUsageClientAuth)
	mc := startMemcached(t, "-Z", "-o", "ssl_chain_cert="+srvCert+",ssl_key="+srvKey+",ssl_ca_cert="+pki.caPath+",ssl_verify_mode=2")

	cfg := envelopeAllConfig(mc)
	cfg.UpstreamTLS = UpstreamTLS{Enabled: true, CAPath: pki.caPath, CertPath: cliCert, KeyPath: cliKey}
	_, addr := startProxy(t, cfg)
	c := newLineClient(t, addr)
	for _, step := range []struct{ req, want string }{
		{"set k 3 0 5\r\nhello\r\n", "STORED\r\n"},
		{"get k\r\n", "VALUE k 3 5\r\nhello\r\nEND\r\n"},
		{"append k 0 0 6\r\n world\r\n", "STORED\r\n"},
		{"gets k\r\n", ""},
		{"delete k\r\n", "DELETED\r\n"},
		{"get k\r\n", "END\r\n"},
	} {
		got := c.do(step.req)
		if step.want == "" {
			if !strings.HasPrefix(got, "VALUE k 3 11 ") || !strings.HasSuffix(got, "\r\nhello world\r\nEND\r\n") {
				t.Fatalf("%q over upstream TLS answered %q", step.req, got)
			}
			continue
		}
		if got != step.want {
			t.Fatalf("%q over upstream TLS answered %q, want %q", step.req, got, step.want)
		}
	}

	// The same memcached refuses what is not TLS with its certificate.
	other := newTestPKI(t, "other")
	for _, tc := range []struct {
		name string
		tls  UpstreamTLS
	}{
		{"plain TCP", UpstreamTLS{}},
		{"a CA that did not sign the server", UpstreamTLS{Enabled: true, CAPath: other.caPath, CertPath: cliCert, KeyPath: cliKey}},
		{"no client certificate", UpstreamTLS{Enabled: true, CAPath: pki.caPath}},
	} {
		cfg := testConfig(mc)
		cfg.Timeout = 500 * time.Millisecond
		cfg.UpstreamTLS = tc.tls
		_, addr := startProxy(t, cfg)
		if got := newLineClient(t, addr).do("set k 0 0 1\r\nx\r\n"); !strings.HasPrefix(got, "SERVER_ERROR") {
			t.Errorf("set through a proxy with %s answered %q, want SERVER_ERROR", tc.name, got)
		}
	}
}

// TestTLSFlagsMustGoTogether checks the settings that cannot work alone.
func TestTLSFlagsMustGoTogether(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"cert without key", func(c *Config) { c.TLS.CertPath = "c.pem" }, "--tls-cert-path and --tls-key-path"},
		{"client CA without cert", func(c *Config) { c.TLS.ClientCAPath = "ca.pem" }, "--tls-client-ca-path needs"},
		{"upstream CA without TLS", func(c *Config) { c.UpstreamTLS.CAPath = "ca.pem" }, "need --upstream-tls-enabled"},
		{"upstream key without cert", func(c *Config) {
			c.UpstreamTLS = UpstreamTLS{Enabled: true, KeyPath: "k.pem"}
		}, "--upstream-tls-cert-path and --upstream-tls-key-path"},
		{"negative connection limit", func(c *Config) { c.MaxConnections = -1 }, "--max-connections"},
		{"negative idle timeout", func(c *Config) { c.IdleTimeout = -time.Second }, "--idle-timeout"},
	} {
		cfg := testConfig("127.0.0.1:11211")
		tc.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error about %s", tc.name, err, tc.want)
		}
	}
	cfg := testConfig("127.0.0.1:11211")
	cfg.TLS = ServerTLS{CertPath: "/nonexistent/c.pem", KeyPath: "/nonexistent/k.pem"}
	if _, err := New(cfg, "test", nil); err == nil || !strings.Contains(err.Error(), "--tls-cert-path") {
		t.Errorf("New with missing certificate files: %v", err)
	}
}

// TestTLSUpstreamChecksTheServerName runs memcached with a certificate for
// 127.0.0.1 and localhost: a proxy that expects another name refuses the
// server, one that expects localhost (or, by default, the address dialed)
// uses it. Verification covers the name, not only the CA. A server whose
// certificate is refused could not be connected to: its failures are of
// kind connect, like a refused connection, and count towards ejecting it.
func TestTLSUpstreamChecksTheServerName(t *testing.T) {
	pki := newTestPKI(t, "memcached")
	srvCert, srvKey := pki.issue(t, "memcached", x509.ExtKeyUsageServerAuth)
	mc := startMemcached(t, "-Z", "-o", "ssl_chain_cert="+srvCert+",ssl_key="+srvKey)
	for _, tc := range []struct{ serverName, want string }{
		{"", "STORED\r\n"},
		{"localhost", "STORED\r\n"},
		{"memcached.other.test", "SERVER_ERROR upstream unavailable\r\n"},
	} {
		cfg := testConfig(mc)
		cfg.Timeout = 500 * time.Millisecond
		cfg.FailureLimit = 2
		cfg.RetryInterval = time.Hour // stays out for the whole test
		cfg.UpstreamTLS = UpstreamTLS{Enabled: true, CAPath: pki.caPath, ServerName: tc.serverName}
		p, addr := startProxy(t, cfg)
		c := newLineClient(t, addr)
		for range cfg.FailureLimit {
			if got := c.do("set k 0 0 1\r\nx\r\n"); got != tc.want {
				t.Errorf("with server name %q, set answered %q, want %q", tc.serverName, got, tc.want)
			}
		}
		if tc.want == "STORED\r\n" {
			continue
		}
		srv := p.upstreams().Servers[0]
		if n := srv.Errors(upstream.KindConnect); n == 0 {
			var kinds []string
			for k := upstream.KindNone + 1; k < upstream.NumKinds; k++ {
				kinds = append(kinds, k.String()+"="+strconv.FormatUint(srv.Errors(k), 10))
			}
			t.Errorf("a refused certificate counted as %v, want connect", kinds)
		}
		if !srv.Ejected() {
			t.Error("a server whose certificate is refused was not ejected")
		}
	}
}

// TestTLSUpstreamHandshakeIsBoundedByTheConnectTimeout points a proxy with
// upstream TLS at a server that accepts connections and never answers the
// handshake. The handshake is part of connecting: a set and a get each
// give up after about --upstream-connect-timeout, well before the much
// longer --upstream-timeout.
func TestTLSUpstreamHandshakeIsBoundedByTheConnectTimeout(t *testing.T) {
	up, _ := stuckUpstream(t)
	cfg := testConfig(up)
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.Timeout = 3 * time.Second
	cfg.UpstreamTLS = UpstreamTLS{Enabled: true, InsecureSkipVerify: true}
	_, addr := startProxy(t, cfg)
	c := newLineClient(t, addr)
	// Generous: the point is the connect timeout, not the upstream one.
	bound := cfg.ConnectTimeout + 2*time.Second
	for _, req := range []struct{ req, want string }{
		{"set k 0 0 1\r\nx\r\n", "SERVER_ERROR upstream timeout\r\n"},
		{"get k\r\n", "END\r\n"},
	} {
		start := time.Now()
		got := c.do(req.req)
		if took := time.Since(start); took > bound {
			t.Errorf("%q took %v with a %v connect timeout, want under %v", req.req, took.Round(time.Millisecond), cfg.ConnectTimeout, bound)
		}
		if got != req.want {
			t.Errorf("%q answered %q, want %q", req.req, got, req.want)
		}
	}
}

// TestTLSUpstreamPipelined: over TLS to memcached, replies of many TLS
// records, which arrive in pieces, to several clients at once, requests
// of several clients in one write, sets of large values pipelined, and a
// session that ends with its memcached, which the next requests replace.
// The event loop keeps every client and speaks TLS itself.
//
// memcached 1.6.18 stalls a TLS connection when a record holds more than
// the rest of a value it reads (see upstream.RequestRecords): the
// pipelined sets time out without it.
func TestTLSUpstreamPipelined(t *testing.T) {
	pki := newTestPKI(t, "memcached")
	srvCert, srvKey := pki.issue(t, "memcached", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := pki.issue(t, "mcsidecar", x509.ExtKeyUsageClientAuth)
	tlsArgs := []string{"-Z", "-o", "ssl_chain_cert=" + srvCert + ",ssl_key=" + srvKey + ",ssl_ca_cert=" + pki.caPath + ",ssl_verify_mode=2"}
	mc, kill := startKillableMemcached(t, tlsArgs...)

	cfg := testConfig(mc)
	cfg.EventLoops = EventLoopsAuto
	cfg.UpstreamTLS = UpstreamTLS{Enabled: true, CAPath: pki.caPath, CertPath: cliCert, KeyPath: cliKey}
	p, addr := startProxy(t, cfg)
	if want := autoLoops(); p.cfg.EventLoops != want {
		t.Fatalf("--event-loops -1 with upstream TLS serves on %d loops, want %d", p.cfg.EventLoops, want)
	}

	large := []int{16 << 10, 16<<10 + 1, 100 << 10, 500 << 10}
	small := []int{0, 1, 1000, 16 << 10, 16<<10 + 1, 40 << 10}
	const clients = 4
	// The large values are set in one write, each with a small one.
	store := func(round int) {
		t.Helper()
		lc := newLineClient(t, addr)
		var sets strings.Builder
		for i, size := range large {
			key := fmt.Sprintf("large-%d-%d", round, i)
			sets.WriteString(setReq("set", key, keyedValue(key, size)))
			sets.WriteString(setReq("set", key+"-small", "v"))
		}
		io.WriteString(lc.c, sets.String())
		for i := range 2 * len(large) {
			if got, err := readReply(lc.br); err != nil || got != "STORED\r\n" {
				t.Fatalf("set %d of the pipelined large values answered %q, %v", i, got, err)
			}
		}
	}
	// Each client writes its small sets in one go, so that they reach
	// memcached in one batch with other clients', then gets every large
	// key and its small ones in one request.
	run := func(c, round int) error {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(nc)
		var b keyBatch
		for i, size := range large {
			b.add(fmt.Sprintf("large-%d-%d", round, i), size, false)
		}
		for i, size := range small {
			b.add(fmt.Sprintf("small-%d-%d-%d", round, c, i), size, true)
		}
		sets, get, want := b.requests()
		if _, err := io.WriteString(nc, sets); err != nil {
			return err
		}
		for i := range small {
			if got, err := readReply(br); err != nil || got != "STORED\r\n" {
				return fmt.Errorf("client %d: set %d (%d bytes) answered %q, %v", c, i, small[i], got, err)
			}
		}
		for range 3 {
			if _, err := io.WriteString(nc, get); err != nil {
				return err
			}
			got, err := readReply(br)
			if err != nil || got != want {
				return fmt.Errorf("client %d: the get of %d keys answered %d bytes (%v), want %d: %q", c, len(large)+len(small), len(got), err, len(want), short(got))
			}
		}
		return nil
	}
	serve := func(round int) {
		t.Helper()
		store(round)
		errs := make(chan error, clients)
		for c := range clients {
			go func() { errs <- run(c, round) }()
		}
		for range clients {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
	serve(0)
	// One each on the loops with clients: the first, and the others
	// clients of long replies moved to.
	if n := loopTLSUpstreams(p); n < 1 || n > p.cfg.EventLoops {
		t.Errorf("the loops hold %d TLS connections upstream, want 1 to %d", n, p.cfg.EventLoops)
	}

	// A memcached restarted ends the session; the loop notices, and the
	// next requests open another.
	kill()
	restartMemcached(t, mc, tlsArgs...)
	deadline := time.Now().Add(10 * time.Second)
	for loopTLSUpstreams(p) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the loop kept its TLS connection to a memcached that was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	serve(1)
}

// keyBatch gathers keys with values of given sizes: their sets, one get
// of them all and its reply.
type keyBatch struct{ sets, keys, values strings.Builder }

// add adds key, with a value of size bytes, set in the batch when set
// says so.
func (b *keyBatch) add(key string, size int, set bool) {
	v := keyedValue(key, size)
	if set {
		b.sets.WriteString(setReq("set", key, v))
	}
	b.keys.WriteString(" " + key)
	b.values.WriteString(strings.TrimSuffix(valueReply(key, 0, v), "END\r\n"))
}

// requests returns the sets, the get, and the get's reply.
func (b *keyBatch) requests() (sets, get, want string) {
	return b.sets.String(), "get" + b.keys.String() + "\r\n", b.values.String() + "END\r\n"
}

// keyedValue is a value of size bytes that says which key it is for.
func keyedValue(key string, size int) string {
	piece := key + "."
	return strings.Repeat(piece, size/len(piece)+1)[:size]
}

// loopTLSUpstreams counts the TLS connections p's event loops hold to
// memcached, asked on each loop.
func loopTLSUpstreams(p *Proxy) int {
	n := 0
	for el, ls := range eventLoopsOf(p) {
		done := make(chan int)
		el.Execute(func() {
			k := 0
			for _, u := range ls.ups {
				if u.tls != nil {
					k++
				}
			}
			done <- k
		})
		n += <-done
	}
	return n
}

// TestTLSClientsOnTheLoop: TLS clients on the event loop (the default),
// several at once: pipelined sets and gets of values of every size, with
// replies of many TLS records; a refused set between gets; a client that
// writes its requests a byte at a time, in a record each; a client that
// ends its session with replies owed.
func TestTLSClientsOnTheLoop(t *testing.T) {
	pki := newTestPKI(t, "clients")
	cert, key := pki.issue(t, "proxy", x509.ExtKeyUsageServerAuth)
	cfg := testConfig(startMemcached(t))
	cfg.EventLoops = EventLoopsAuto
	cfg.TLS = ServerTLS{CertPath: cert, KeyPath: key}
	p, addr := startProxy(t, cfg)
	if want := autoLoops(); p.cfg.EventLoops != want {
		t.Fatalf("--event-loops -1 with TLS to clients serves on %d loops, want %d", p.cfg.EventLoops, want)
	}

	sizes := []int{0, 1, 1000, 16 << 10, 16<<10 + 1, 100 << 10, 300 << 10}
	run := func(c int) error {
		tc, err := tlsDial(t, addr, pki.caPath, "", "")
		if err != nil {
			return err
		}
		tc.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(tc)
		var b keyBatch
		for i, size := range sizes {
			b.add(fmt.Sprintf("c%d-%d", c, i), size, true)
		}
		sets, get, want := b.requests()
		// The sets and two gets in one write.
		if _, err := io.WriteString(tc, sets+get+get); err != nil {
			return err
		}
		for i := range sizes {
			if got, err := readReply(br); err != nil || got != "STORED\r\n" {
				return fmt.Errorf("client %d: set %d answered %q, %v", c, i, got, err)
			}
		}
		for range 2 {
			if got, err := readReply(br); err != nil || got != want {
				return fmt.Errorf("client %d: the get answered %d bytes (%v), want %d: %q", c, len(got), err, len(want), short(got))
			}
		}
		// A refused set between gets, in one write.
		one := fmt.Sprintf("c%d-1", c)
		if _, err := io.WriteString(tc, "get "+one+"\r\n"+refusedSet+get); err != nil {
			return err
		}
		for i, w := range []string{valueReply(one, 0, keyedValue(one, 1)), refusedSetReply, want} {
			if got, err := readReply(br); err != nil || got != w {
				return fmt.Errorf("client %d: reply %d around the refused set: %q (%v), want %q", c, i, short(got), err, short(w))
			}
		}
		if got := roundTrip(tc, get); got != want {
			return fmt.Errorf("client %d: a get after them answered %d bytes, want %d", c, len(got), len(want))
		}
		return nil
	}
	const clients = 4
	errs := make(chan error, clients)
	for c := range clients {
		go func() { errs <- run(c) }()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}

	// A byte a time: each write makes a TLS record of one byte.
	tc, err := tlsDial(t, addr, pki.caPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	for _, b := range []byte("set one 5 0 3\r\nabc\r\nget one\r\n") {
		if _, err := tc.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(tc)
	for i, want := range []string{"STORED\r\n", "VALUE one 5 3\r\nabc\r\nEND\r\n"} {
		if got, err := readReply(br); err != nil || got != want {
			t.Errorf("reply %d to a request sent a byte a time: %q, %v", i, got, err)
		}
	}

	// A client that ends its session (close_notify) after more requests
	// than the loop answers at once still gets every reply, as a plain
	// client that half-closes does, all from the loop. Then the session
	// ends, and the connection closes.
	tc, err = tlsDial(t, addr, pki.caPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	const gets = loopMaxSlots + 44
	io.WriteString(tc, strings.Repeat("get one\r\n", gets)+"set two 0 0 1\r\n2\r\n")
	if err := tc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(tc)
	for i := range gets {
		if got, err := readReply(br); err != nil || got != "VALUE one 5 3\r\nabc\r\nEND\r\n" {
			t.Fatalf("reply %d after the client's close_notify: %q, %v", i, got, err)
		}
	}
	if got, err := readReply(br); err != nil || got != "STORED\r\n" {
		t.Errorf("the set after %d gets and before close_notify: %q, %v", gets, got, err)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the replies: read %q (%v), want the session's end (close_notify)", b, err)
	}
	tc, err = tlsDial(t, addr, pki.caPath, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(tc, "get two\r\n"); got != "VALUE two 0 1\r\n2\r\nEND\r\n" {
		t.Errorf("the set sent before close_notify: get answered %q", got)
	}
}

// TestTLSClientEndsItsSessionWhileTheLoopHoldsRecords pipelines gets of a
// 16 KiB value over TLS and reads nothing until evloop holds encrypted
// replies the socket did not take; then the client ends its session and
// its side of the connection. Every reply owed must still reach it, whole
// and in order, and then the session's end.
func TestTLSClientEndsItsSessionWhileTheLoopHoldsRecords(t *testing.T) {
	pki := newTestPKI(t, "clients")
	cert, key := pki.issue(t, "proxy", x509.ExtKeyUsageServerAuth)
	cfg := loopConfig(startMemcached(t))
	cfg.TLS = ServerTLS{CertPath: cert, KeyPath: key}
	_, addr := startProxy(t, cfg)
	roots, err := loadCAs(pki.caPath)
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("t", 16<<10)
	want := "VALUE big 0 16384\r\n" + value + "\r\nEND\r\n"
	const gets = 500
	{
		raw := dialSmallWindow(t, addr)
		tc := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if got := roundTrip(tc, "set big 0 0 16384\r\n"+value+"\r\n"); got != "STORED\r\n" {
			t.Fatalf("set answered %q", got)
		}
		tc.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(tc, strings.Repeat("get big\r\n", gets)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		tc.CloseWrite()                 // close_notify
		raw.(*net.TCPConn).CloseWrite() // and the end of the stream
		time.Sleep(100 * time.Millisecond)
		br := bufio.NewReader(tc)
		for j := range gets {
			if got, err := readReply(br); err != nil || got != want {
				t.Fatalf("reply %d: %q (%v), want %q", j, short(got), err, short(want))
			}
		}
		if b, err := br.ReadByte(); err != io.EOF {
			t.Errorf("after the replies: read %q (%v), want the session's end (close_notify)", b, err)
		}
	}
}
