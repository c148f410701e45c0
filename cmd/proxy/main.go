// Command proxy builds mcsidecar, the memcached sidecar: a
// memcached-protocol server placed between store-gateways and a fleet of
// memcached servers. The directory keeps its name; the program, its usage
// line, its image and its messages are mcsidecar.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

// program is the one name: in the usage line, in its errors and in
// the image, whose binary is /mcsidecar.
const program = "mcsidecar"

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

// parsed settles what depends on which flags were given: zones replace
// --upstream, whose default then does not apply, and --max-value-size
// follows --max-item-size unless it is given.
func (c *config) parsed(fs *pflag.FlagSet) error {
	c.proxy.DefaultMaxValueSize(fs)
	if fs.Changed("upstream-zone") {
		if fs.Changed("upstream") {
			return errors.New("give --upstream or --upstream-zone, not both")
		}
		c.proxy.Upstreams = nil
	}
	return nil
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
		return fmt.Errorf("--shutdown-grace %v: must not be negative", c.shutdownGrace)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return fmt.Errorf("--log-format %q: must be text or json", c.logFormat)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: must be debug, info, warn or error", c.logLevel)
	}
	return nil
}

func (c *config) logger(w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(c.logLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.logFormat == "json" {
		opts.ReplaceAttr = readableDuration
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// readableDuration writes a duration as the text handler and the flags do,
// "30s", where the JSON handler would write nanoseconds.
func readableDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func main() {
	// SIGTERM (a Kubernetes rollout) and SIGINT start a graceful shutdown.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, program+":", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down within --shutdown-grace and
// returns nil. It returns an error for a bad flag, before anything
// listens, or when serving fails.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config
	fs := pflag.NewFlagSet(program, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.registerFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.printVersion {
		fmt.Fprintln(stdout, program, version)
		return nil
	}
	if err := cfg.parsed(fs); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.logger(stderr)

	// The version reply starts with the memcached release whose protocol
	// the proxy speaks: libmemcached (memcstat and the clients built on
	// it) asks for the version first and refuses one that does not start
	// with a number.
	p, err := proxy.New(cfg.proxy, "1.6.0-mcsidecar-"+version, log)
	if err != nil {
		return err
	}
	// New may have started DNS discovery: a start that fails past it stops
	// the proxy again, so nothing of it outlives run.
	stop := func() { p.Shutdown(context.Background()) }
	reg, err := newRegistry(p)
	if err != nil {
		stop()
		return err
	}
	ln, err := proxy.Listen(cfg.proxy.Listen)
	if err != nil {
		stop()
		return fmt.Errorf("--listen %q: %w", cfg.proxy.Listen, err)
	}
	var metricsSrv *http.Server
	if cfg.metricsListen != "" {
		mln, err := net.Listen("tcp", cfg.metricsListen)
		if err != nil {
			ln.Close()
			stop()
			return fmt.Errorf("--metrics-listen %q: %w", cfg.metricsListen, err)
		}
		metricsSrv = &http.Server{Handler: newHTTPHandler(p, reg), ReadHeaderTimeout: 5 * time.Second}
		go metricsSrv.Serve(mln)
	}
	log.Info("serving", "listen", ln.Addr().String(), "upstreams", cfg.proxy.Upstreams, "zone", cfg.proxy.Zone, "zones", cfg.proxy.ZoneUpstreams, "metrics", cfg.metricsListen, "version", version)

	serveErr := make(chan error, 1)
	go func() { serveErr <- p.Serve(ln) }()
	select {
	case err := <-serveErr:
		if metricsSrv != nil {
			metricsSrv.Close()
		}
		return err
	case <-ctx.Done():
		log.Info("shutting down", "grace", cfg.shutdownGrace)
	}
	graceCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdownGrace)
	defer cancel()
	err = p.Shutdown(graceCtx)
	<-serveErr
	if metricsSrv != nil {
		metricsSrv.Shutdown(graceCtx)
	}
	if err != nil {
		log.Warn("grace period over, connections closed", "err", err)
	}
	log.Info("stopped")
	return nil
}
