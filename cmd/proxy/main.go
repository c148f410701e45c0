// Command proxy runs the memcached sidecar: a memcached-protocol server
// placed between store-gateways and a fleet of memcached servers.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

// config is the command's own settings; each package registers its own.
type config struct {
	proxy         proxy.Config
	codec         codec.Config
	keys          keyspace.Config
	metricsListen string
	shutdownGrace time.Duration
	logLevel      string
	logFormat     string
	printVersion  bool
}

func (c *config) registerFlags(fs *pflag.FlagSet) {
	c.proxy.RegisterFlags(fs)
	c.codec.RegisterFlags(fs)
	c.proxy.Codec = &c.codec
	c.keys.RegisterFlags(fs)
	c.proxy.Keys = &c.keys
	fs.StringVar(&c.metricsListen, "metrics-listen", "127.0.0.1:9151", "HTTP address for /metrics, /healthz and /readyz (empty: off)")
	fs.DurationVar(&c.shutdownGrace, "shutdown-grace", 10*time.Second, "on SIGTERM, how long in-flight requests may take before connections are closed")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&c.printVersion, "version", false, "print version and exit")
}

func (c *config) validate() error {
	if err := c.codec.Validate(); err != nil {
		return err
	}
	if err := c.keys.Validate(); err != nil {
		return err
	}
	if err := c.proxy.Validate(); err != nil {
		return err
	}
	if c.shutdownGrace < 0 {
		return errors.New("--shutdown-grace must not be negative")
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return errors.New("--log-format must be text or json")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	return nil
}

func (c *config) logger(w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(c.logLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	var cfg config
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.registerFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.printVersion {
		fmt.Fprintln(stdout, "mcsidecar", version)
		return nil
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.logger(stderr)

	p, err := proxy.New(cfg.proxy, "mcsidecar-"+version, log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := p.Register(reg); err != nil {
		return err
	}
	ln, err := proxy.Listen(cfg.proxy.Listen)
	if err != nil {
		return err
	}
	var metricsSrv *http.Server
	if cfg.metricsListen != "" {
		mln, err := net.Listen("tcp", cfg.metricsListen)
		if err != nil {
			ln.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if err := p.Ready(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ready\n")
		})
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go metricsSrv.Serve(mln)
	}
	log.Info("serving", "listen", ln.Addr().String(), "upstreams", cfg.proxy.Upstreams, "metrics", cfg.metricsListen, "version", version)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	serveErr := make(chan error, 1)
	go func() { serveErr <- p.Serve(ln) }()
	select {
	case err := <-serveErr:
		return err
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "grace", cfg.shutdownGrace)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownGrace)
	defer cancel()
	err = p.Shutdown(ctx)
	if metricsSrv != nil {
		metricsSrv.Shutdown(ctx)
	}
	if err != nil {
		log.Warn("grace period over, connections closed", "err", err)
	}
	return nil
}
