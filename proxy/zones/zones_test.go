package zones

import (
	"slices"
	"strings"
	"testing"
)

// TestSpecsPutTheLocalZoneFirst: the local zone leads, the others follow
// in the order given, and each keeps its entries as written.
func TestSpecsPutTheLocalZoneFirst(t *testing.T) {
	specs, err := Specs(nil, []string{"a=127.0.0.1:1,127.0.0.1:2", " b = 127.0.0.1:3", "c=127.0.0.1:4"}, "b")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range specs {
		got = append(got, s.Name+"="+strings.Join(s.Entries, ","))
	}
	want := []string{"b=127.0.0.1:3", "a=127.0.0.1:1,127.0.0.1:2", "c=127.0.0.1:4"}
	if !slices.Equal(got, want) {
		t.Fatalf("specs %q, want %q", got, want)
	}
	specs, err = Specs([]string{"127.0.0.1:1"}, nil, "")
	if err != nil || len(specs) != 1 || specs[0].Name != "" || !slices.Equal(specs[0].Entries, []string{"127.0.0.1:1"}) {
		t.Fatalf("without zones: %+v, %v", specs, err)
	}
}

// TestSpecsRefuseWhatCannotWork: each bad combination of flags is refused
// with the flag it is about.
func TestSpecsRefuseWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		upstreams, zoneUpstreams []string
		local, want              string
	}{
		{nil, nil, "", "--upstream names no server"},
		{nil, nil, "a", "--zone needs --upstream-zone"},
		{[]string{"127.0.0.1:1"}, []string{"a=127.0.0.1:2"}, "a", "not both"},
		{nil, []string{"a=127.0.0.1:2"}, "", "--upstream-zone needs --zone"},
		{nil, []string{"a"}, "a", "want NAME=ENTRY"},
		{nil, []string{"a=127.0.0.1:1", "a=127.0.0.1:2"}, "a", `zone "a" is given twice`},
		{nil, []string{"a=127.0.0.1:1", "b=127.0.0.1:1"}, "a", "is in zones"},
		{nil, []string{"a=127.0.0.1:1,"}, "a", `bad entry ""`},
		{nil, []string{"a=127.0.0.1:1"}, "b", `--zone "b" is not one of the --upstream-zone names (a)`},
	} {
		_, err := Specs(tc.upstreams, tc.zoneUpstreams, tc.local)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Specs(%q, %q, %q) = %v, want an error with %q", tc.upstreams, tc.zoneUpstreams, tc.local, err, tc.want)
		}
	}
}
