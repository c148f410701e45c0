package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// operationsDoc is the reference every flag, metric and alert must have a
// row in.
const operationsDoc = "../../docs/operations.md"

var (
	// helpFlag is a flag's line in --help: its long name after optional
	// shorthand.
	helpFlag = regexp.MustCompile(`^\s+(?:-[A-Za-z0-9], )?--([a-z0-9][a-z0-9-]*)`)
	docFlag  = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)`")
	// docMetric is a metric family named in full in a reference row.
	docMetric = regexp.MustCompile("`(mcsidecar_[a-z0-9_]+)`")
	docAlert  = regexp.MustCompile("`(Mcsidecar[A-Za-z0-9]+)`")
)

// TestOperationsReferenceNamesEveryFlagMetricAndAlert keeps
// docs/operations.md in step with the program: every flag --help lists,
// every mcsidecar_ family a sidecar in front of a real memcached exports
// (without zones, and with zones and the local tier, whose families exist
// only then) and every alert in configs/ has a row in its reference
// section, and no row names one that is gone.
func TestOperationsReferenceNamesEveryFlagMetricAndAlert(t *testing.T) {
	data, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)

	compare(t, "flag", "--", helpFlags(t), rowNames(t, doc, "Flags", docFlag))

	var metrics []string
	for _, s := range []sidecar{startBusySidecar(t), startBusyZonedSidecar(t)} {
		for name := range s.scrape(t) {
			if strings.HasPrefix(name, "mcsidecar_") && !slices.Contains(metrics, name) {
				metrics = append(metrics, name)
			}
		}
	}
	compare(t, "metric", "", metrics, rowNames(t, doc, "Metrics", docMetric))

	compare(t, "alert", "", alertNames(t), rowNames(t, doc, "Alerts", docAlert))
}

// helpFlags returns the long name of every flag --help prints.
func helpFlags(t *testing.T) []string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, &out); err != nil {
		t.Fatalf("--help: %v", err)
	}
	var names []string
	for _, line := range strings.Split(out.String(), "\n") {
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("--help listed %d flags; is its format still pflag's?\n%s", len(names), out.String())
	}
	return names
}

// alertNames returns the name of every alert rule in the shipped rules.
func alertNames(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../configs/prometheus-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert string }
		}
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// rowNames returns the names that the first cells of the table rows under
// the level-two heading title hold, as name matches them: a row may name
// several ("`--tls-cert-path`, `--tls-key-path`").
func rowNames(t *testing.T, doc, title string, name *regexp.Regexp) []string {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", operationsDoc, "## "+title)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no rows under %q", operationsDoc, "## "+title)
	}
	return names
}

// compare reports every name the program has and the reference lacks, and
// every name the reference has that the program no longer does.
func compare(t *testing.T, kind, prefix string, program, documented []string) {
	t.Helper()
	for _, n := range program {
		if !slices.Contains(documented, n) {
			t.Errorf("%s %s%s exists but has no row in %s: add one", kind, prefix, n, operationsDoc)
		}
	}
	for _, n := range documented {
		if !slices.Contains(program, n) {
			t.Errorf("%s names %s %s%s, which no longer exists: remove or rename its row", operationsDoc, kind, prefix, n)
		}
	}
}
