package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// ServerTLS is TLS towards clients. It is off unless a certificate is
// given; with a client CA, every client must show a certificate it signed.
// The flag names follow Mimir's own TLS settings (-…-tls-cert-path,
// -…-tls-key-path, -…-tls-ca-path), so a certificate mounted for a
// store-gateway reads the same here.
type ServerTLS struct {
	CertPath     string
	KeyPath      string
	ClientCAPath string
}

func (t *ServerTLS) registerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&t.CertPath, "tls-cert-path", "", "PEM certificate (chain) served to clients; with --tls-key-path turns on TLS for clients (off by default)")
	fs.StringVar(&t.KeyPath, "tls-key-path", "", "PEM private key of --tls-cert-path")
	fs.StringVar(&t.ClientCAPath, "tls-client-ca-path", "", "PEM CA certificates; when set, clients must present a certificate signed by one of them")
}

func (t *ServerTLS) validate() error {
	switch {
	case (t.CertPath == "") != (t.KeyPath == ""):
		return errors.New("--tls-cert-path and --tls-key-path go together")
	case t.ClientCAPath != "" && t.CertPath == "":
		return errors.New("--tls-client-ca-path needs --tls-cert-path and --tls-key-path")
	}
	return nil
}

// config loads the files; nil means clients speak plain TCP.
func (t *ServerTLS) config() (*tls.Config, error) {
	if t.CertPath == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertPath, t.KeyPath)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-path/--tls-key-path: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAPath != "" {
		if cfg.ClientCAs, err = loadCAs(t.ClientCAPath); err != nil {
			return nil, fmt.Errorf("--tls-client-ca-path: %w", err)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// UpstreamTLS is TLS towards the memcached servers (memcached -Z, since
// 1.5.13). The flags carry the names of Mimir's memcached client options
// (-…memcached.tls-enabled, tls-ca-path, tls-cert-path, tls-key-path,
// tls-server-name, tls-insecure-skip-verify) behind the upstream- prefix
// of every other upstream flag.
type UpstreamTLS struct {
	Enabled            bool
	CAPath             string
	CertPath           string
	KeyPath            string
	ServerName         string
	InsecureSkipVerify bool
}

func (t *UpstreamTLS) registerFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&t.Enabled, "upstream-tls-enabled", false, "connect to the memcached servers with TLS")
	fs.StringVar(&t.CAPath, "upstream-tls-ca-path", "", "PEM CA certificates that sign the servers' certificates (default: the system's)")
	fs.StringVar(&t.CertPath, "upstream-tls-cert-path", "", "PEM client certificate shown to servers that verify clients")
	fs.StringVar(&t.KeyPath, "upstream-tls-key-path", "", "PEM private key of --upstream-tls-cert-path")
	fs.StringVar(&t.ServerName, "upstream-tls-server-name", "", "name the servers' certificates must carry (default: the host of each --upstream)")
	fs.BoolVar(&t.InsecureSkipVerify, "upstream-tls-insecure-skip-verify", false, "accept any server certificate (testing only)")
}

func (t *UpstreamTLS) validate() error {
	set := t.CAPath != "" || t.CertPath != "" || t.KeyPath != "" || t.ServerName != "" || t.InsecureSkipVerify
	switch {
	case set && !t.Enabled:
		return errors.New("--upstream-tls-* settings need --upstream-tls-enabled")
	case (t.CertPath == "") != (t.KeyPath == ""):
		return errors.New("--upstream-tls-cert-path and --upstream-tls-key-path go together")
	}
	return nil
}

// config loads the files; nil means plain TCP to the servers.
func (t *UpstreamTLS) config() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	var err error
	if t.CAPath != "" {
		if cfg.RootCAs, err = loadCAs(t.CAPath); err != nil {
			return nil, fmt.Errorf("--upstream-tls-ca-path: %w", err)
		}
	}
	if t.CertPath != "" {
		cert, err := tls.LoadX509KeyPair(t.CertPath, t.KeyPath)
		if err != nil {
			return nil, fmt.Errorf("--upstream-tls-cert-path/--upstream-tls-key-path: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
