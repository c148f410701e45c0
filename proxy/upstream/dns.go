package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resolver looks up the addresses behind dns+, dnssrv+ and dnssrvnoa+
// upstream entries. *net.Resolver is one; tests use a fake that answers
// with the loopback addresses of memcached servers they started.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
}

// Kinds of --upstream entry, with grafana/dskit's meaning of each prefix.
type entryKind uint8

const (
	entryStatic entryKind = iota // host:port or unix:/path, used as it is
	entryDNS                     // dns+host:port: every A/AAAA record of host
	entrySRV                     // dnssrv+name: the addresses of every SRV target
	entrySRVNoA                  // dnssrvnoa+name: every SRV target as named
)

// Entry is one parsed --upstream entry. For the DNS kinds, name is what is
// looked up; port is the entry's own, which for SRV overrides the record's.
type Entry struct {
	kind       entryKind
	name, port string
}

// LookupTimeout bounds one lookup of every DNS entry.
const LookupTimeout = 10 * time.Second

var (
	errNoRecords = errors.New("no records")
	errNoPort    = errors.New("no port")
)

// EntryForms names the forms of an --upstream entry, for the errors that
// refuse one.
const EntryForms = "host:port, unix:/path, dns+host:port, dnssrv+_service._proto.name or dnssrvnoa+_service._proto.name"

// EntryError refuses an --upstream entry and says why.
type EntryError struct {
	Entry, Reason string
}

func (e *EntryError) Error() string { return fmt.Sprintf("--upstream %q: %s", e.Entry, e.Reason) }

// ParseEntry reads one --upstream entry: host:port, unix:/path, or one of
// the DNS kinds. Its error is an *EntryError.
func ParseEntry(s string) (Entry, error) {
	if rest, ok := strings.CutPrefix(s, "dns+"); ok {
		host, port, err := splitHostPort(rest)
		switch {
		case err == errNoPort || err == nil && host == "":
			return Entry{}, &EntryError{s, "want dns+host:port"}
		case err != nil:
			return Entry{}, &EntryError{s, err.Error()}
		}
		// An IPv6 literal is written in brackets, and looked up without.
		return Entry{kind: entryDNS, name: strings.Trim(host, "[]"), port: port}, nil
	}
	kind := entrySRV
	rest, ok := strings.CutPrefix(s, "dnssrv+")
	if !ok {
		kind = entrySRVNoA
		rest, ok = strings.CutPrefix(s, "dnssrvnoa+")
	}
	if ok {
		e := Entry{kind: kind, name: rest}
		if host, port, err := splitHostPort(rest); err == nil {
			e.name, e.port = host, port
		}
		if e.name == "" {
			return Entry{}, &EntryError{s, "want " + s[:len(s)-len(rest)] + "_service._proto.name"}
		}
		return e, nil
	}
	if _, _, err := splitUpstream(s); err != nil {
		return Entry{}, err
	}
	return Entry{kind: entryStatic, name: s}, nil
}

// Static reports whether the entry names its server as it is, without a
// lookup.
func (e Entry) Static() bool { return e.kind == entryStatic }

// Resolve turns the --upstream entries into server names, each named once.
// Any lookup that fails or finds nothing fails the whole: a partial set
// would move the keys of the servers it misses.
func Resolve(ctx context.Context, r Resolver, entries []string) ([]string, error) {
	var names []string
	add := func(name string) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	hosts := func(host, port string) error {
		addrs, err := r.LookupHost(ctx, host)
		if err == nil && len(addrs) == 0 {
			err = errNoRecords
		}
		if err != nil {
			return fmt.Errorf("lookup %s: %w", host, err)
		}
		for _, a := range addrs {
			add(net.JoinHostPort(a, port))
		}
		return nil
	}
	for _, s := range entries {
		e, err := ParseEntry(s)
		if err != nil {
			return nil, err
		}
		switch e.kind {
		case entryStatic:
			add(s)
		case entryDNS:
			if err := hosts(e.name, e.port); err != nil {
				return nil, err
			}
		case entrySRV, entrySRVNoA:
			_, recs, err := r.LookupSRV(ctx, "", "", e.name)
			if err == nil && len(recs) == 0 {
				err = errNoRecords
			}
			if err != nil {
				return nil, fmt.Errorf("lookup SRV %s: %w", e.name, err)
			}
			for _, rec := range recs {
				port := e.port
				if port == "" {
					port = strconv.Itoa(int(rec.Port))
				}
				if e.kind == entrySRVNoA {
					add(net.JoinHostPort(strings.TrimSuffix(rec.Target, "."), port))
				} else if err := hosts(rec.Target, port); err != nil {
					return nil, err
				}
			}
		}
	}
	return names, nil
}

// splitUpstream turns an --upstream entry into a network and address.
func splitUpstream(s string) (network, addr string, err error) {
	if path, ok := strings.CutPrefix(s, "unix:"); ok {
		if path == "" {
			return "", "", &EntryError{s, "empty socket path: want unix:/path"}
		}
		return "unix", path, nil
	}
	host, port, err := splitHostPort(s)
	if err == errNoPort {
		return "", "", &EntryError{s, "no port: want " + EntryForms}
	} else if err != nil {
		return "", "", &EntryError{s, err.Error()}
	}
	return "tcp", host + ":" + port, nil
}

func splitHostPort(s string) (host, port string, err error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", errNoPort
	}
	host, port = s[:i], s[i+1:]
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return host, port, nil
}
