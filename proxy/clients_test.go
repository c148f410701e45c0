package proxy

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripts below drive the clients other languages' users run through
// the same steps, in each client's own words: storage commands and their
// refusals, counters, cas, touch, a multi-key read, a 600 KB value holding
// every byte, and a postings value the proxy compresses. The README's test
// command installs the clients from Debian (python3-pymemcache,
// python3-pylibmc, libcache-memcached-fast-perl).

// pythonScript runs with the client named by its first argument,
// pymemcache or pylibmc; the two differ in how they are made, in the name
// of the multi-key read and in how incr tells of a missing key.
const pythonScript = `
import sys
which, host, port, postings, pvalue = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].encode()
if which == "pymemcache":
    from pymemcache.client.base import Client
    c = Client((host, int(port)), default_noreply=False, connect_timeout=5, timeout=10)
    get_multi = c.get_many
    def incr_missing():
        return c.incr("nope", 1)
else:
    import pylibmc
    c = pylibmc.Client([host + ":" + port], binary=False, behaviors={"cas": True})
    get_multi = c.get_multi
    def incr_missing():
        try:
            return c.incr("nope", 1)
        except pylibmc.NotFound:
            return None
out = []
out.append(c.set("k1", b"v1"))
out.append(c.get("k1"))
out.append(c.add("k1", b"x"))
out.append(c.add("k2", b"v2"))
out.append(c.replace("nope", b"x"))
out.append(c.replace("k2", b"w2"))
out.append(c.append("k2", b"-a"))
out.append(c.prepend("k2", b"p-"))
out.append(c.get("k2"))
out.append(c.set("n", b"10"))
out.append(c.incr("n", 5))
out.append(c.decr("n", 20))
out.append(incr_missing())
v, cas = c.gets("k1")
out.append(v)
out.append(c.cas("k1", b"c1", cas))
out.append(c.cas("k1", b"c2", cas))
out.append(c.get("k1"))
out.append(c.touch("k1", 100))
out.append(c.touch("nope", 100))
out.append(sorted(get_multi(["k1", "k2", "nope", "n"]).items()))
big = bytes(range(256)) * 2400
out.append(c.set("big", big))
out.append(c.get("big") == big)
out.append(c.set(postings, pvalue))
out.append(c.get(postings) == pvalue)
out.append(c.delete("k1"))
out.append(c.delete("k1"))
out.append(c.get("k1"))
for o in out:
    print(repr(o))
`

const perlScript = `
use strict;
use warnings;
use Cache::Memcached::Fast;
my ($server, $postings, $pvalue) = @ARGV;
my $c = Cache::Memcached::Fast->new({ servers => [$server], connect_timeout => 5, io_timeout => 10 });
my @out;
my $s = sub { my $v = shift; push @out, defined $v ? $v : "undef" };
$s->($c->set("k1", "v1"));
$s->($c->get("k1"));
$s->($c->add("k1", "x"));
$s->($c->add("k2", "v2"));
$s->($c->replace("nope", "x"));
$s->($c->replace("k2", "w2"));
$s->($c->append("k2", "-a"));
$s->($c->prepend("k2", "p-"));
$s->($c->get("k2"));
$s->($c->set("n", "10"));
$s->($c->incr("n", 5));
$s->($c->decr("n", 20));
$s->($c->incr("nope", 1));
my $g = $c->gets("k1");
$s->($g->[1]);
$s->($c->cas("k1", $g->[0], "c1"));
$s->($c->cas("k1", $g->[0], "c2"));
$s->($c->get("k1"));
$s->($c->touch("k1", 100));
$s->($c->touch("nope", 100));
my $m = $c->get_multi("k1", "k2", "nope", "n");
$s->(join(",", map { "$_=$m->{$_}" } sort keys %$m));
my $big = join("", map { chr } 0..255) x 2400;
$s->($c->set("big", $big));
$s->($c->get("big") eq $big ? "same" : "differs");
$s->($c->set($postings, $pvalue));
$s->($c->get($postings) eq $pvalue ? "same" : "differs");
$s->($c->delete("k1"));
$s->($c->delete("k1"));
$s->($c->get("k1"));
print "$_\n" for @out;
`

// clientScript runs one script with args and returns what it printed.
func clientScript(t *testing.T, interp, script string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath(interp); err != nil {
		t.Fatalf("%s is not installed (the README's test command installs it): %v", interp, err)
	}
	flag := "-c"
	if strings.HasSuffix(interp, "perl") {
		flag = "-e"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, interp, append([]string{flag, script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", interp, args[:2], err, out)
	}
	return string(out)
}

// TestClientsInOtherLanguagesSeeWhatMemcachedAnswers runs each script
// against memcached itself and through the proxy: it must print the same
// lines.
func TestClientsInOtherLanguagesSeeWhatMemcachedAnswers(t *testing.T) {
	postings := "P:" + testTenant("b", 20) + ":" + testBlock + ":" + testHash43 + ":" + testHash43
	pvalue := strings.Repeat("postings 0123456789 ", 1000)
	// Each client's arguments before the key and value, given the
	// server's address.
	python := func(client string) func(addr string) []string {
		return func(addr string) []string {
			host, port, _ := strings.Cut(addr, ":")
			return []string{client, host, port}
		}
	}
	for _, tc := range []struct {
		name, interp, script string
		args                 func(addr string) []string
	}{
		{"pymemcache", "/usr/bin/python3", pythonScript, python("pymemcache")},
		{"pylibmc", "/usr/bin/python3", pythonScript, python("pylibmc")},
		{"Cache::Memcached::Fast", "/usr/bin/perl", perlScript, func(addr string) []string { return []string{addr} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(addr string) string {
				return clientScript(t, tc.interp, tc.script, append(tc.args(addr), postings, pvalue)...)
			}
			want := run(startMemcached(t))
			_, addr := startProxy(t, keyspaceConfig(startMemcached(t)))
			got := run(addr)
			if got != want {
				t.Fatalf("through the proxy %s printed\n%s\nagainst memcached\n%s", tc.name, got, want)
			}
			if n := strings.Count(want, "\n"); n != 27 {
				t.Fatalf("the script printed %d lines, want 27:\n%s", n, want)
			}
			// The postings value went through the codec: it was stored in
			// fewer bytes than the client sent.
			st := statsOf(t, newLineClient(t, addr))
			logical, _ := strconv.Atoi(st["codec_written_logical_bytes"])
			stored, _ := strconv.Atoi(st["codec_written_stored_bytes"])
			if logical < len(pvalue) || stored == 0 || stored >= logical {
				t.Errorf("codec wrote %d logical bytes as %d stored; want the %d-byte postings value compressed", logical, stored, len(pvalue))
			}
		})
	}
}
