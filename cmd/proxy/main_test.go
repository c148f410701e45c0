package main

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// sidecarArg matches a "- --flag=value" line of a container's args.
var sidecarArg = regexp.MustCompile(`(?m)^\s*-\s+(--[a-z][a-z0-9-]*(?:=\S*)?)\s*$`)

// TestConfigExamplesUseRealFlags parses the sidecar's arguments out of
// every example in configs/ and runs them through the real flag set and
// validation, so an example cannot name a flag that does not exist or a
// value that would not start.
func TestConfigExamplesUseRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in configs/: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var args []string
		for _, m := range sidecarArg.FindAllSubmatch(data, -1) {
			args = append(args, string(m[1]))
		}
		if len(args) == 0 {
			t.Errorf("%s: no sidecar arguments found", f)
			continue
		}
		var cfg config
		fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		cfg.registerFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if err := cfg.validate(); err != nil {
			t.Errorf("%s: %v", f, err)
		}
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
		{"--no-such-flag"},
	} {
		var out bytes.Buffer
		err := run(append(args, "--listen=127.0.0.1:0", "--metrics-listen="), &out, &out)
		if err == nil {
			t.Errorf("%v: started, want an error", args)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error is not one line: %q", args, err)
		}
	}
}

func TestVersionFlagPrintsVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--version"}, &out, &out); err != nil {
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
