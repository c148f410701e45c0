package main

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
)

// container is the part of a Kubernetes container spec the examples are
// checked on.
type container struct {
	Name  string
	Image string
	Args  []string
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

// TestConfigExamplesUseRealFlags parses every Kubernetes example in
// configs/ and runs the sidecar's arguments through the real flag set and
// validation, so an example cannot name a flag that does not exist or a
// value that would not start; and checks that the Mimir container next to
// it points its index cache at the sidecar's --listen address.
func TestConfigExamplesUseRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	examples := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range workloads(t, data) {
			var sidecar *container
			for i := range pod {
				if strings.Contains(pod[i].Image, "mcsidecar") {
					sidecar = &pod[i]
				}
			}
			if sidecar == nil {
				continue
			}
			examples++
			var cfg config
			fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
			fs.SetOutput(&bytes.Buffer{})
			cfg.registerFlags(fs)
			if err := fs.Parse(sidecar.Args); err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if err := cfg.parsed(fs); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			if err := cfg.validate(); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			const cacheAddr = "-blocks-storage.bucket-store.index-cache.memcached.addresses="
			pointed := false
			for _, c := range pod {
				for _, a := range c.Args {
					if addr, ok := strings.CutPrefix(a, cacheAddr); ok && addr == cfg.proxy.Listen {
						pointed = true
					}
				}
			}
			if !pointed {
				t.Errorf("%s: no container sets %s%s", f, cacheAddr, cfg.proxy.Listen)
			}
			// A zone-aware store-gateway's sidecar serves the store-gateway's
			// own zone.
			const ringZone = "-store-gateway.sharding-ring.instance-availability-zone="
			for _, c := range pod {
				for _, a := range c.Args {
					if zone, ok := strings.CutPrefix(a, ringZone); ok && zone != cfg.proxy.Zone {
						t.Errorf("%s: the store-gateway is in zone %q, its sidecar runs --zone=%q", f, zone, cfg.proxy.Zone)
					}
				}
			}
		}
	}
	if examples == 0 {
		t.Fatal("no Kubernetes example with an mcsidecar container in configs/")
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
		{[]string{"--zone=zone-a", a, "--zone-writes=some"}, "--zone-writes must be all or local"},
		{[]string{"--zone=zone-a", a, "--zone-writes=ALL"}, "--zone-writes must be all or local"},
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

// TestDockerfileBuildCommandBuildsAStaticBinary runs the Dockerfile's own
// build command (no Docker engine needed) and checks that the result is a
// static binary that starts.
func TestDockerfileBuildCommandBuildsAStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var build string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			build = strings.TrimPrefix(line, "RUN ")
		}
	}
	if build == "" {
		t.Fatal("no go build step in the Dockerfile")
	}
	out := filepath.Join(t.TempDir(), "proxy")
	build = strings.ReplaceAll(build, "/out/proxy", out)
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
