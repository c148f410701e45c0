package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// Config is everything the proxy needs to listen and reach its upstreams.
type Config struct {
	Listen    string
	Upstreams []string
	// Zone is the availability zone this sidecar serves, and
	// ZoneUpstreams the servers of every zone, each "NAME=ENTRY[,ENTRY…]"
	// with entries as in Upstreams; they are given instead of Upstreams.
	// See package zones.
	Zone          string
	ZoneUpstreams []string
	// ZoneWrites is zones.WritesAll (writes go to every zone; "" too) or
	// zones.WritesLocal; ZoneFill stores a hit found in another zone into
	// the local one.
	ZoneWrites       string
	ZoneFill         bool
	Selector         string
	Timeout          time.Duration
	ConnectTimeout   time.Duration
	MaxIdleConns     int
	GetBatchKeys     int
	RetrievalFailure string
	MaxItemSize      ByteSize
	// MaxValueSize is the largest value a client may send: 0 is
	// MaxItemSize, and any other value must be at least MaxItemSize. Only
	// an enveloped value can be larger than MaxItemSize and still be
	// stored, when it compresses below it.
	MaxValueSize   ByteSize
	MaxRequestLine ByteSize
	// MaxConnections is the most client connections served at once; 0 is
	// no limit. IdleTimeout closes a client connection that completes no
	// request, or takes none of its replies, for that long; 0 never does.
	MaxConnections int
	IdleTimeout    time.Duration
	// MaxClientOutput is the most bytes of replies a client may be owed
	// and not have read (see output.go); 0 is defaultMaxClientOutput.
	MaxClientOutput ByteSize

	// TLS, both off by default: see tls.go.
	TLS         ServerTLS
	UpstreamTLS UpstreamTLS

	// FailureLimit is how many consecutive failures (connect errors and
	// timeouts) eject a server for RetryInterval; 0 never ejects.
	FailureLimit  int
	RetryInterval time.Duration
	// EjectRehash sends the keys of an ejected server to the servers left
	// instead of answering them as misses.
	EjectRehash bool
	// DNSInterval is how often dns+ and dnssrv+ entries are looked up.
	DNSInterval time.Duration
	// Resolver looks those entries up; nil is net.DefaultResolver. Tests
	// set it, and it is not offered as a flag.
	Resolver Resolver

	// Codec holds the value settings, registered by the codec package;
	// nil serves every value as it is, with no envelope.
	Codec *codec.Config
	// EnvelopeAll envelopes every value, whatever its key and flags. It is
	// for tests, which run the whole differential suite through the codec,
	// and is not offered as a flag.
	EnvelopeAll bool

	// Keys holds the key settings, registered by the keyspace package; nil
	// forwards keys as memcached's own limits allow (up to 250 bytes,
	// and keys gomemcache cannot send are misses or refused). With it,
	// keys up to its client maximum are accepted and those the upstream
	// cannot carry are rewritten, their values enveloped and bound to the
	// client key, which needs Codec.
	Keys *keyspace.Config

	// LocalCacheSize is the memory of the local tier, which keeps values
	// whose key scheme says they never change (see tier.go); 0 is off. It
	// needs Keys: the schemes say which keys are immutable.
	LocalCacheSize ByteSize

	// MetricsTenants bounds the tenants with series of their own in the
	// per-tenant metrics; 0 turns the per-tenant view off. It needs Keys:
	// the key schemes name the tenant of a key.
	MetricsTenants int

	// EventLoops is how many event loops serve the clients (see
	// loop.go); 0 means one; EventLoopsAuto, see autoLoops.
	EventLoops int
}

// EventLoopsAuto is the EventLoops (and --event-loops) that leaves the
// count to the proxy: see autoLoops.
const EventLoopsAuto = -1

// autoLoops is how many loops EventLoopsAuto makes: the first, where
// every client begins and light ones stay, and one per processor
// (GOMAXPROCS as the first proxy of the process finds it, at most 8) for
// the clients that read long replies (see loopmove.go).
func autoLoops() int { return 1 + min(asideWorkers(), 8) }

// Replies to a retrieval whose upstream failed, for --upstream-retrieval-failure.
const (
	failureMiss  = "miss"
	failureError = "error"
)

// RegisterFlags adds the proxy's flags to fs, with defaults meant for a
// sidecar of a Mimir store-gateway.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:11311", "memcached-protocol address to serve: host:port or unix:/path")
	fs.StringSliceVar(&c.Upstreams, "upstream", []string{"127.0.0.1:11211"}, "memcached servers, repeatable or comma-separated: host:port, unix:/path, dns+host:port (every A/AAAA record), dnssrv+_service._proto.name (SRV targets' addresses) or dnssrvnoa+_service._proto.name (SRV targets as named)")
	fs.StringVar(&c.Zone, "zone", "", "the availability zone this sidecar serves, one of the --upstream-zone names: reads go to its servers first, then to the other zones in the order given")
	fs.StringArrayVar(&c.ZoneUpstreams, "upstream-zone", nil, "NAME=ENTRY[,ENTRY…], repeatable: the memcached servers of one zone, entries as in --upstream; given instead of --upstream, with --zone")
	fs.StringVar(&c.ZoneWrites, "zone-writes", zones.WritesAll, "with zones: all (storage commands, delete, touch and flush_all reach every zone; the local zone's reply answers) or local (writes reach the local zone only)")
	fs.BoolVar(&c.ZoneFill, "zone-fill", true, "with zones: store a hit found in another zone into the local zone, with its remaining time to live (an add: a newer local value is kept)")
	fs.StringVar(&c.Selector, "upstream-selector", upstream.SelectJump, "server selection: jump (dskit's jump hash over xxhash64, as Mimir and Thanos clients pick) or ketama (libmemcached/twemproxy continuum, MD5)")
	fs.DurationVar(&c.Timeout, "upstream-timeout", 200*time.Millisecond, "read/write timeout of one upstream request")
	fs.DurationVar(&c.ConnectTimeout, "upstream-connect-timeout", 100*time.Millisecond, "timeout to connect to an upstream server")
	fs.IntVar(&c.MaxIdleConns, "upstream-max-idle-conns", 100, "idle connections kept per upstream server")
	// Deployments still pass it; it set the batches in flight of the
	// goroutine per connection, which is gone: event loops pipeline
	// every request on their own connections.
	fs.Int("upstream-get-concurrency", 1, "ignored")
	fs.MarkDeprecated("upstream-get-concurrency", "it is ignored: event loops pipeline every request on their own connections")
	fs.IntVar(&c.GetBatchKeys, "upstream-get-batch-keys", 100, "most keys an event loop joins into one upstream multi-get")
	fs.StringVar(&c.RetrievalFailure, "upstream-retrieval-failure", failureMiss, "reply to a retrieval whose upstream failed: miss or error (SERVER_ERROR)")
	fs.IntVar(&c.FailureLimit, "upstream-failure-limit", 3, "consecutive failures (connect errors, timeouts) that eject a server; 0 never ejects")
	fs.DurationVar(&c.RetryInterval, "upstream-retry-interval", time.Second, "how long a server stays ejected before it is probed with version; it is back at the first answer")
	fs.BoolVar(&c.EjectRehash, "upstream-eject-rehash", false, "send the keys of an ejected server to the servers left (risks stale reads when it comes back) instead of answering them as misses")
	fs.DurationVar(&c.DNSInterval, "upstream-dns-interval", 30*time.Second, "how often dns+ and dnssrv+ upstream entries are looked up again")
	c.MaxItemSize = 1 << 20
	fs.Var(&c.MaxItemSize, "max-item-size", "largest item stored upstream, as memcached's -I: an enveloped value counts as stored, compressed and with its header (bytes, or with k/m/g suffix; at most 1 GiB)")
	// Left at 0 here: DefaultMaxValueSize gives it, from --max-item-size,
	// once the flags are parsed.
	fs.Var(&c.MaxValueSize, "max-value-size", "largest value a client may send, at least --max-item-size (bytes, or with k/m/g suffix; default: twice --max-item-size, at most 1 GiB); over --max-item-size it is stored only if its envelope fits, so only values of enveloped keys can use the difference")
	c.MaxRequestLine = 1 << 20
	fs.Var(&c.MaxRequestLine, "max-request-line", "longest retrieval command line (other lines follow memcached's 2048-byte framing)")
	fs.IntVar(&c.MaxConnections, "max-connections", 4096, "most client connections at once, like memcached's -c; one more is answered \"ERROR Too many open connections\" and closed (0: no limit)")
	c.MaxClientOutput = defaultMaxClientOutput
	fs.Var(&c.MaxClientOutput, "max-client-output-bytes", "most bytes of replies one client connection may be owed and not have read (bytes, or with k/m suffix; 0: 4m): at it an event loop answers none of the client's further gets until it reads, though one get is answered whenever nothing is owed, however long its reply; a client whose replies wait on it for --idle-timeout is closed")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 0, "close a client connection that completes no request, or takes none of its replies, for this long, like memcached's idle_timeout (0: never)")
	fs.Var(&c.LocalCacheSize, "local-cache-size", "memory of the local tier, which serves values that never change (keys of a scheme marked immutable: block-scoped index-cache keys, byte ranges of block files) from the sidecar itself, counted as values, keys and bookkeeping (bytes, or with k/m/g suffix); 0 turns it off")
	c.TLS.registerFlags(fs)
	c.UpstreamTLS.registerFlags(fs)
	c.EventLoops = EventLoopsAuto
	fs.Var((*loopCount)(&c.EventLoops), "event-loops", "serve clients on this many event loops, each with its own upstream connections; -1 (auto): one for clients of short replies and one per processor, up to 8, for clients that read long ones")
	fs.IntVar(&c.MetricsTenants, "metrics-tenants", 20, "busiest tenants with per-tenant metrics of their own (the rest are counted as \"other\"); 0: no per-tenant metrics")
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	if c.Listen == "" {
		return errors.New("--listen is empty: want host:port or unix:/path")
	}
	specs, err := c.zoneSpecs()
	if err != nil {
		return err
	}
	if err := upstream.CheckScheme(c.Selector); err != nil {
		return fmt.Errorf("--upstream-selector %q: want %s or %s", c.Selector, upstream.SelectJump, upstream.SelectKetama)
	}
	switch {
	case c.Timeout <= 0:
		return errors.New("--upstream-timeout must be positive")
	case c.ConnectTimeout <= 0:
		return errors.New("--upstream-connect-timeout must be positive")
	case c.MaxIdleConns < 1:
		return errors.New("--upstream-max-idle-conns must be at least 1")
	case c.GetBatchKeys < 1:
		return errors.New("--upstream-get-batch-keys must be at least 1")
	case c.FailureLimit < 0:
		return errors.New("--upstream-failure-limit must not be negative")
	case c.FailureLimit > 0 && c.RetryInterval <= 0:
		return errors.New("--upstream-retry-interval must be positive")
	case c.DNSInterval <= 0 && c.discovers():
		return errors.New("--upstream-dns-interval must be positive")
	case c.ZoneWrites != "" && c.ZoneWrites != zones.WritesAll && c.ZoneWrites != zones.WritesLocal:
		return fmt.Errorf("--zone-writes %q: must be %s or %s", c.ZoneWrites, zones.WritesAll, zones.WritesLocal)
	case c.RetrievalFailure != failureMiss && c.RetrievalFailure != failureError:
		return fmt.Errorf("--upstream-retrieval-failure %q: must be %s or %s", c.RetrievalFailure, failureMiss, failureError)
	case c.MaxItemSize < 1 || c.MaxItemSize > maxSize:
		return fmt.Errorf("--max-item-size %d: must be between 1 byte and 1 GiB (%d)", c.MaxItemSize, maxSize)
	case c.MaxValueSize < 0 || c.MaxValueSize > maxSize:
		return fmt.Errorf("--max-value-size %d: must be between 0 and 1 GiB (%d)", c.MaxValueSize, maxSize)
	case c.MaxValueSize != 0 && c.MaxValueSize < c.MaxItemSize:
		// Raising it quietly would accept values the operator meant to
		// refuse; which of the two is wrong only the operator knows.
		return fmt.Errorf("--max-value-size %d is below --max-item-size %d: give a --max-value-size of at least %d, or a smaller --max-item-size", c.MaxValueSize, c.MaxItemSize, c.MaxItemSize)
	case c.MaxRequestLine < wire.LineLimit:
		return fmt.Errorf("--max-request-line %d: must be at least %d", c.MaxRequestLine, wire.LineLimit)
	case c.Keys != nil && int(c.MaxRequestLine) < wire.KeyedLineMax(c.Keys.MaxClientLength):
		// A get of one key as long as clients may send would be cut off.
		return fmt.Errorf("--max-request-line %d is shorter than a line holding a key of --key-max-client-length %d: give at least %d, or a smaller --key-max-client-length",
			c.MaxRequestLine, c.Keys.MaxClientLength, wire.KeyedLineMax(c.Keys.MaxClientLength))
	case c.MaxConnections < 0:
		return errors.New("--max-connections must not be negative")
	case c.IdleTimeout < 0:
		return errors.New("--idle-timeout must not be negative")
	case c.MaxClientOutput < 0:
		return errors.New("--max-client-output-bytes must not be negative")
	case c.MetricsTenants < 0 || c.MetricsTenants > 1000:
		return errors.New("--metrics-tenants must be between 0 and 1000")
	case c.EnvelopeAll && c.Codec == nil:
		return errors.New("enveloping every value needs codec settings")
	case c.EventLoops < EventLoopsAuto || c.EventLoops > 256:
		return errors.New("--event-loops must be -1 (auto) or between 1 and 256")
	case c.LocalCacheSize > 0 && c.Keys == nil:
		return errors.New("--local-cache-size needs the key schemes: they say which values never change")
	case c.Keys != nil && c.Codec == nil:
		return errors.New("key rewriting needs codec settings: values under rewritten keys are enveloped")
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	if err := c.UpstreamTLS.validate(); err != nil {
		return err
	}
	if t := c.UpstreamTLS; t.Enabled && t.ServerName == "" && !t.InsecureSkipVerify {
		for _, z := range specs {
			for _, u := range z.Entries {
				if _, unix := cutUnix(u); unix {
					return fmt.Errorf("--upstream %s: a unix socket has no host name to check a TLS certificate against: set --upstream-tls-server-name", u)
				}
			}
		}
	}
	if c.Codec != nil {
		if err := c.Codec.Validate(); err != nil {
			return err
		}
	}
	if c.Keys != nil {
		return c.Keys.Validate()
	}
	return nil
}

// maxSize bounds --max-item-size and --max-value-size, as memcached
// bounds -I.
const maxSize = 1 << 30

// maxValueSize is the largest value a client may send.
func (c *Config) maxValueSize() int {
	if c.MaxValueSize == 0 {
		return int(c.MaxItemSize)
	}
	return int(c.MaxValueSize)
}

// DefaultMaxValueSize gives MaxValueSize its flag default, twice
// MaxItemSize and at most 1 GiB, when it was not given: a value that
// compresses to half its size or better (postings lists do) still fits,
// and a connection never holds more than that for one command. Call it
// once the flags are parsed, so that raising --max-item-size alone raises
// it too, and a --max-value-size that is given is only ever checked.
func (c *Config) DefaultMaxValueSize(fs *pflag.FlagSet) {
	if !fs.Changed("max-value-size") {
		c.MaxValueSize = min(2*c.MaxItemSize, maxSize)
	}
}

// maxClientOutput is the most reply bytes a client may be owed: the
// default when the configuration leaves it 0.
func (c *Config) maxClientOutput() int {
	if c.MaxClientOutput > 0 {
		return int(c.MaxClientOutput)
	}
	return defaultMaxClientOutput
}

// loopCount is --event-loops: -1 or 1 to 256. 0 once chose a goroutine
// per connection instead of a loop; that path is gone, and 0 is refused
// rather than read as something else.
type loopCount int

func (n *loopCount) String() string { return strconv.Itoa(int(*n)) }

// Type names the flag's value type in --help.
func (n *loopCount) Type() string { return "int" }

// Set parses a loop count.
func (n *loopCount) Set(s string) error {
	v, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return errors.New("want a number of event loops: -1 (auto) or 1 to 256")
	case v == 0:
		return errors.New("0 (a goroutine per connection) is no longer offered: every client is served on an event loop; give -1 (auto) or 1 to 256")
	}
	*n = loopCount(v)
	return nil
}

// ByteSize is a byte count flag that also takes k, m and g suffixes (powers
// of 1024), the way memcached's -I does.
type ByteSize int

func (b *ByteSize) String() string { return strconv.Itoa(int(*b)) }

// Type names the flag's value type in --help.
func (b *ByteSize) Type() string { return "bytes" }

// Set parses a size such as 1048576, 1024k, 1m or 1g.
func (b *ByteSize) Set(s string) error {
	mult, num := 1, s
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mult, num = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"), strings.HasSuffix(s, "M"):
		mult, num = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"), strings.HasSuffix(s, "G"):
		mult, num = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return fmt.Errorf("bad size %q: want a byte count up to 1 TiB, or one with a k, m or g suffix (1048576, 1024k, 1m)", s)
	}
	*b = ByteSize(n * mult)
	return nil
}

// zoneSpecs returns the zones the flags configure (see zones.Specs).
func (c *Config) zoneSpecs() ([]zones.Spec, error) {
	return zones.Specs(c.Upstreams, c.ZoneUpstreams, c.Zone)
}
