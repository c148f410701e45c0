package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"mcsidecar/proxy"
)

// container is the part of a Kubernetes container spec the examples are
// checked on.
type container struct {
	Name    string
	Image   string
	Command []string
	Args    []string
}

// workloads returns the containers of every pod template in a YAML file of
// Kubernetes manifests.
func workloads(t *testing.T, data []byte) [][]container {
	t.Helper()
	var out [][]container
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct{ Containers []container }
				}
			}
		}
		if err := dec.Decode(&doc); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if cs := doc.Spec.Template.Spec.Containers; len(cs) > 0 {
			out = append(out, cs)
		}
	}
}

// TestConfigExamplesUseRealFlags parses every Kubernetes example and every
// set of mimir-distributed Helm values in configs/ and runs the sidecar's
// arguments, as the pod would run them, through the real flag set and
// validation, so an example cannot name a flag that does not exist or a
// value that would not start; and checks that the store-gateway next to
// it points its index cache at the sidecar's --listen address.
func TestConfigExamplesUseRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifests, charts := 0, 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range workloads(t, data) {
			for _, c := range pod {
				if !strings.Contains(c.Image, "mcsidecar") {
					continue
				}
				manifests++
				var others [][]string
				for _, o := range pod {
					others = append(others, o.Args)
				}
				checkSidecarPod(t, f, c.Args, others)
			}
		}
		for _, pod := range helmPods(t, data) {
			charts++
			checkSidecarPod(t, f+" "+pod.where, pod.sidecar, [][]string{pod.storeGateway})
		}
	}
	if manifests == 0 {
		t.Fatal("no Kubernetes example with an mcsidecar container in configs/")
	}
	if charts == 0 {
		t.Fatal("no mimir-distributed values with an mcsidecar container in configs/")
	}
}

func TestBadFlagValueFailsBeforeListening(t *testing.T) {
	for _, args := range [][]string{
		{"--upstream-selector=modulo"},
		{"--upstream=no-port"},
		{"--upstream-timeout=0s"},
		{"--upstream=dns+no-port"},
		{"--upstream=dnssrv+"},
		{"--upstream-failure-limit=-1"},
		{"--upstream-retry-interval=0s"},
		{"--upstream=dns+localhost:11211", "--upstream-dns-interval=0s"},
		{"--max-item-size=lots"},
		{"--max-value-size=2048m"},
		{"--codec-flag-bit=32"},
		{"--key-max-length=251"},
		{"--key-max-client-length=100"},
		{"--key-schemes=nosuch"},
		{"--key-scheme=bad"},
		{"--codec-min-savings=1.5"},
		{"--codec-prefixes=P2:,,E2:"},
		{"--log-format=xml"},
		{"--max-connections=-1"},
		{"--idle-timeout=-1s"},
		{"--upstream-tls-ca-path=/etc/ssl/ca.pem"},
		{"--tls-cert-path=/nonexistent/cert.pem", "--tls-key-path=/nonexistent/key.pem"},
		{"--upstream-tls-enabled", "--upstream-tls-ca-path=/nonexistent/ca.pem"},
		{"--upstream-tls-enabled", "--upstream=unix:/run/memcached.sock"},
		{"--no-such-flag"},
	} {
		refused(t, args, "")
	}
	// Zone flags that cannot work. Each case is otherwise valid, so the
	// error must be the zone one: want is part of its text.
	const a, b = "--upstream-zone=zone-a=127.0.0.1:11211", "--upstream-zone=zone-b=127.0.0.1:11212"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{a, b}, "--upstream-zone needs --zone"},
		{[]string{"--zone=zone-c", a, b}, `--zone "zone-c" is not one of the --upstream-zone names`},
		{[]string{"--zone=zone-a", a, b, "--upstream=127.0.0.1:11213"}, "--upstream or --upstream-zone, not both"},
		// --upstream given with its default value is given all the same.
		{[]string{"--zone=zone-a", a, "--upstream=127.0.0.1:11211"}, "--upstream or --upstream-zone, not both"},
		{[]string{"--zone=zone-a"}, "--zone needs --upstream-zone"},
		{[]string{"--zone=zone-a", "--upstream=127.0.0.1:11211"}, "--zone needs --upstream-zone"},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-a=127.0.0.1:11212"}, `zone "zone-a" is given twice`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=127.0.0.1:11211"}, "server 127.0.0.1:11211 is in zones"},
		{[]string{"--zone=zone-a", a, "--zone-writes=some"}, "must be all or local"},
		{[]string{"--zone=zone-a", a, "--zone-writes=ALL"}, "must be all or local"},
		// Malformed NAME=ENTRY[,ENTRY…].
		{[]string{"--zone=zone-a", "--upstream-zone=127.0.0.1:11211"}, "want NAME=ENTRY"},
		{[]string{"--zone=zone-a", a, "--upstream-zone==127.0.0.1:11212"}, "want NAME=ENTRY"},
		{[]string{"--zone=zone-a", a, "--upstream-zone= =127.0.0.1:11212"}, "want NAME=ENTRY"},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b="}, "want NAME=ENTRY"},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=no-port"}, `bad entry "no-port"`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=127.0.0.1:11212,"}, `bad entry ""`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=dnssrv+"}, `bad entry "dnssrv+"`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=dns+no-port"}, `bad entry "dns+no-port"`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=unix:"}, `bad entry "unix:"`},
		{[]string{"--zone=zone-a", "--upstream-zone=zone-a=dns+localhost:11211", "--upstream-dns-interval=0s"}, "--upstream-dns-interval must be positive"},
	} {
		refused(t, c.args, c.want)
	}
}

// TestRefusedFlagValueNamesWhatIsAccepted checks that a value the command
// refuses is answered with the values it takes or the limit it broke, so
// the operator can fix the flag from the message alone.
func TestRefusedFlagValueNamesWhatIsAccepted(t *testing.T) {
	const a, b = "--upstream-zone=zone-a=127.0.0.1:11211", "--upstream-zone=zone-b=127.0.0.1:11212"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-level=verbose"}, `--log-level "verbose": must be debug, info, warn or error`},
		{[]string{"--log-format=xml"}, `--log-format "xml": must be text or json`},
		{[]string{"--shutdown-grace=-1s"}, "--shutdown-grace -1s: must not be negative"},
		{[]string{"--upstream-selector=modulo"}, `--upstream-selector "modulo": want jump or ketama`},
		{[]string{"--upstream-retrieval-failure=fail"}, `--upstream-retrieval-failure "fail": must be miss or error`},
		{[]string{"--zone=zone-a", a, "--zone-writes=some"}, `--zone-writes "some": must be all or local`},
		{[]string{"--upstream=no-port"}, `--upstream "no-port": no port: want host:port, unix:/path, dns+host:port, dnssrv+_service._proto.name or dnssrvnoa+_service._proto.name`},
		{[]string{"--upstream=127.0.0.1:0"}, `--upstream "127.0.0.1:0": port "0": want a number from 1 to 65535`},
		{[]string{"--upstream=dns+cache:http"}, `--upstream "dns+cache:http": port "http": want a number from 1 to 65535`},
		{[]string{"--upstream=unix:"}, "want unix:/path"},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=no-port"}, `bad entry "no-port": no port: want host:port, unix:/path`},
		{[]string{"--zone=zone-a", a, "--upstream-zone=zone-b=127.0.0.1:11212,"}, `bad entry "": want host:port, unix:/path`},
		{[]string{"--zone=zone-c", a, b}, `--zone "zone-c" is not one of the --upstream-zone names (zone-a, zone-b)`},
		{[]string{"--max-item-size=lots"}, `bad size "lots": want a byte count up to 1 TiB, or one with a k, m or g suffix`},
		{[]string{"--max-item-size=12x"}, `bad size "12x"`},
		{[]string{"--max-item-size=2g"}, "--max-item-size 2147483648: must be between 1 byte and 1 GiB (1073741824)"},
		{[]string{"--max-value-size=2048m"}, "--max-value-size 2147483648: must be between 0 and 1 GiB (1073741824)"},
		{[]string{"--key-max-length=251"}, "--key-max-length must be between 64 and 250"},
		{[]string{"--key-max-client-length=100"}, "--key-max-client-length 100: must be at least --key-max-length (250)"},
		{[]string{"--key-schemes=nosuch"}, `unknown scheme "nosuch" (known: `},
		{[]string{"--key-scheme=x+fast=X:{tenant}"}, "+postings and +immutable are known"},
		{[]string{"--codec-flag-bit=32"}, "want a bit number from 0 to 31"},
		{[]string{"--codec-min-savings=1.5"}, "from 0 to 1"},
		{[]string{"--metrics-tenants=1001"}, "--metrics-tenants must be between 0 and 1000"},
		{[]string{"--event-loops=300"}, "--event-loops must be -1 (auto) or between 1 and 256"},
		{[]string{"--event-loops=0"}, `invalid argument "0" for "--event-loops" flag: 0 (a goroutine per connection) is no longer offered`},
		{[]string{"--event-loops=two"}, `invalid argument "two" for "--event-loops" flag: want a number of event loops`},
		{[]string{"--max-request-line=100"}, "--max-request-line 100: must be at least 2048"},
		{[]string{"--max-request-line=64k"}, "--max-request-line 65536 is shorter than a line holding a key of --key-max-client-length 65536: give at least 89432, or a smaller --key-max-client-length"},
	} {
		refused(t, c.args, c.want)
	}
}

// TestConflictingSizesAreRefusedNotRaised checks that a --max-value-size
// below --max-item-size stops the command with both numbers, where it was
// once raised to --max-item-size without a word; and that the default
// follows --max-item-size, so raising the item size alone still starts.
func TestConflictingSizesAreRefusedNotRaised(t *testing.T) {
	refused(t, []string{"--max-item-size=2m", "--max-value-size=1m"},
		"--max-value-size 1048576 is below --max-item-size 2097152: give a --max-value-size of at least 2097152, or a smaller --max-item-size")
	refused(t, []string{"--max-item-size=4m", "--max-value-size=2m"}, "is below --max-item-size")
	for _, c := range []struct {
		args []string
		want proxy.ByteSize
	}{
		{nil, 2 << 20},
		{[]string{"--max-item-size=4m"}, 8 << 20},
		{[]string{"--max-item-size=256k"}, 512 << 10},
		{[]string{"--max-item-size=1g"}, 1 << 30},
		{[]string{"--max-item-size=4m", "--max-value-size=4m"}, 4 << 20},
		{[]string{"--max-value-size=3m"}, 3 << 20},
	} {
		var cfg config
		fs := pflag.NewFlagSet(program, pflag.ContinueOnError)
		cfg.registerFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if err := cfg.parsed(fs); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if err := cfg.validate(); err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if cfg.proxy.MaxValueSize != c.want {
			t.Errorf("%v: --max-value-size is %d, want %d", c.args, cfg.proxy.MaxValueSize, c.want)
		}
	}
}

// TestJSONLogsWriteDurationsAsText checks that a duration in a JSON log
// line reads as the flags are written ("30s"), not as nanoseconds, at the
// top level and inside a group.
func TestJSONLogsWriteDurationsAsText(t *testing.T) {
	var out bytes.Buffer
	cfg := config{logLevel: "info", logFormat: "json"}
	cfg.logger(&out).Info("shutting down", "grace", 30*time.Second, slog.Group("upstream", "retry_interval", 1500*time.Millisecond), "n", 3)
	var line struct {
		Grace    any
		Upstream struct {
			RetryInterval any `json:"retry_interval"`
		}
		N any
	}
	if err := json.Unmarshal(out.Bytes(), &line); err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	if line.Grace != "30s" || line.Upstream.RetryInterval != "1.5s" {
		t.Errorf("durations logged as %#v and %#v, want \"30s\" and \"1.5s\": %s", line.Grace, line.Upstream.RetryInterval, out.String())
	}
	if line.N != 3.0 {
		t.Errorf("a number logged as %#v: %s", line.N, out.String())
	}
}

// TestDeprecatedFlagStillStarts checks that --upstream-get-concurrency,
// which deployments still pass though it no longer does anything, is
// taken with a warning, not refused.
func TestDeprecatedFlagStillStarts(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	args := []string{"--upstream=127.0.0.1:1", "--upstream-get-concurrency=4", "--listen=127.0.0.1:0", "--metrics-listen="}
	if err := run(ctx, args, &out, &out); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	if !strings.Contains(out.String(), "--upstream-get-concurrency has been deprecated") {
		t.Errorf("no deprecation warning:\n%s", out.String())
	}
}

// refused runs the command with args and checks that it fails before it
// serves, with a one-line error holding want.
func refused(t *testing.T, args []string, want string) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := run(ctx, append(args, "--listen=127.0.0.1:0", "--metrics-listen="), &out, &out)
	if err == nil {
		t.Errorf("%v: started, want an error", args)
		return
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%v: error is not one line: %q", args, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%v: error %q, want it to say %q", args, err, want)
	}
}

func TestVersionFlagPrintsVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "mcsidecar ") {
		t.Fatalf("--version printed %q", out.String())
	}
}

// dockerImage is what the Dockerfile says about the binary: the go build
// step, the path it writes, where the runtime image holds it and the
// entrypoint that runs it.
type dockerImage struct {
	build, out, binary string
	entrypoint         []string
}

// readDockerfile reads those four out of the Dockerfile.
func readDockerfile(t *testing.T) dockerImage {
	t.Helper()
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var img dockerImage
	var copied string
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build"):
			img.build = strings.TrimPrefix(line, "RUN ")
			f := strings.Fields(img.build)
			if i := slices.Index(f, "-o"); i >= 0 && i+1 < len(f) {
				img.out = f[i+1]
			}
		case strings.HasPrefix(line, "COPY --from=build "):
			if f := strings.Fields(line); len(f) == 4 {
				copied, img.binary = f[2], f[3]
			}
		case strings.HasPrefix(line, "ENTRYPOINT "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT ")), &img.entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT is not an exec-form JSON list: %v", err)
			}
		}
	}
	if img.build == "" || img.out == "" {
		t.Fatal("no go build -o step in the Dockerfile")
	}
	if copied != img.out {
		t.Fatalf("the runtime image copies %q, the build writes %q", copied, img.out)
	}
	return img
}

// TestImageRunsTheBinaryAsMcsidecar checks the one name in the image: the
// binary is /mcsidecar, the entrypoint runs it, and its arguments are
// real flags with values that start.
func TestImageRunsTheBinaryAsMcsidecar(t *testing.T) {
	img := readDockerfile(t)
	if img.binary != "/"+program {
		t.Errorf("the image holds its binary at %q, want /%s", img.binary, program)
	}
	if path.Base(img.out) != program {
		t.Errorf("the build writes %q, want a binary named %s", img.out, program)
	}
	if len(img.entrypoint) == 0 || img.entrypoint[0] != img.binary {
		t.Fatalf("ENTRYPOINT %q does not run the image's binary %s", img.entrypoint, img.binary)
	}
	var cfg config
	fs := pflag.NewFlagSet(program, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.registerFlags(fs)
	if err := fs.Parse(img.entrypoint[1:]); err != nil {
		t.Fatalf("ENTRYPOINT %q: %v", img.entrypoint, err)
	}
	if err := cfg.parsed(fs); err != nil {
		t.Fatalf("ENTRYPOINT %q: %v", img.entrypoint, err)
	}
	if err := cfg.validate(); err != nil {
		t.Fatalf("ENTRYPOINT %q: %v", img.entrypoint, err)
	}
}

func TestHelpNamesTheProgram(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(out.String(), "\n"); first != "Usage of "+program+":" {
		t.Errorf("--help starts %q, want \"Usage of %s:\"", first, program)
	}
	if !strings.Contains(out.String(), "--max-value-size") {
		t.Errorf("--help lists no flags:\n%s", out.String())
	}
}

// TestDockerfileBuildCommandBuildsAStaticBinary runs the Dockerfile's own
// build command (no Docker engine needed) and checks that the result is a
// static binary that starts, and that names itself mcsidecar when a flag
// is refused.
func TestDockerfileBuildCommandBuildsAStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	img := readDockerfile(t)
	out := filepath.Join(t.TempDir(), program)
	build := strings.ReplaceAll(img.build, img.out, out)
	build = strings.ReplaceAll(build, "${VERSION}", "test")
	cmd := exec.Command("sh", "-c", build)
	cmd.Dir = "../.."
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, msg)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary needs a dynamic loader; the runtime image has none")
		}
	}
	msg, err := exec.Command(out, "--version").CombinedOutput()
	if err != nil || string(msg) != "mcsidecar test\n" {
		t.Fatalf("--version: %v %q", err, msg)
	}
	msg, err = exec.Command(out, "--log-level=verbose").CombinedOutput()
	if err == nil || !strings.HasPrefix(string(msg), program+": --log-level") {
		t.Errorf("a refused flag: %v, printed %q; want one line starting %q", err, msg, program+": --log-level")
	}
}

// TestFailedStartLeavesNothingRunning starts the command with DNS
// discovery on (a goroutine of the proxy's own) and a listen address that
// is taken: run must fail and stop what it started.
func TestFailedStartLeavesNothingRunning(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	before := goleak.IgnoreCurrent()
	var out bytes.Buffer
	err = run(context.Background(), []string{"--listen=" + taken.Addr().String(), "--metrics-listen=",
		"--upstream=dns+localhost:11211", "--upstream-dns-interval=1h"}, &out, &out)
	if err == nil {
		t.Fatal("started on a taken address")
	}
	goleak.VerifyNone(t, before)
}

// checkSidecarPod runs a sidecar's arguments through the real flag set and
// validation, and checks the store-gateway's arguments among others: its
// index cache is the sidecar, and a sidecar with zones serves the
// store-gateway's own zone.
func checkSidecarPod(t *testing.T, where string, args []string, others [][]string) {
	t.Helper()
	var cfg config
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	cfg.registerFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	if err := cfg.parsed(fs); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	const cacheAddr = "-blocks-storage.bucket-store.index-cache.memcached.addresses="
	const ringZone = "-store-gateway.sharding-ring.instance-availability-zone="
	pointed := false
	for _, c := range others {
		for _, a := range c {
			if addr, ok := strings.CutPrefix(a, cacheAddr); ok && addr == cfg.proxy.Listen {
				pointed = true
			}
			// A store-gateway with a zone may share one cache with every
			// zone (a sidecar without --zone), but a sidecar with zones
			// serves its store-gateway's zone.
			if zone, ok := strings.CutPrefix(a, ringZone); ok && cfg.proxy.Zone != "" && zone != cfg.proxy.Zone {
				t.Errorf("%s: the store-gateway is in zone %q, its sidecar runs --zone=%q", where, zone, cfg.proxy.Zone)
			}
		}
	}
	if !pointed {
		t.Errorf("%s: no container sets %s%s", where, cacheAddr, cfg.proxy.Listen)
	}
}
