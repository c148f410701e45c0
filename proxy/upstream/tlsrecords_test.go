package upstream

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// records captures what RequestRecords writes, one slice per record.
type records [][]byte

func (r *records) Write(p []byte) (int, error) {
	*r = append(*r, bytes.Clone(p))
	return len(p), nil
}

// values returns where each value in stream starts and ends, CRLF
// included, reading the stream as memcached would.
func values(t testing.TB, stream string) (starts, ends []int) {
	for at := 0; at < len(stream); {
		nl := strings.IndexByte(stream[at:], '\n')
		if nl < 0 {
			break
		}
		f := strings.Fields(stream[at : at+nl])
		at += nl + 1
		i := -1
		switch f[0] {
		case "set", "add", "replace", "append", "prepend", "cas":
			i = 4
		case "ms":
			i = 2
		}
		if i < 0 {
			continue
		}
		n, err := strconv.Atoi(f[i])
		if err != nil {
			t.Fatalf("bad request line %q", f)
		}
		starts = append(starts, at)
		at += n + 2
		ends = append(ends, at)
	}
	return starts, ends
}

// checkRecords writes stream through RequestRecords in writes cut at
// cuts, and checks that the records carry the stream unchanged, that a
// record ends at every value's end, and that lines without a value go
// together only up to recordLines and one line more.
func checkRecords(t testing.TB, stream string, cuts []int) {
	t.Helper()
	var out records
	w := RequestRecords(&out)
	from := 0
	for _, c := range append(cuts, len(stream)) {
		if c < from || c > len(stream) {
			continue
		}
		if n, err := w.Write([]byte(stream[from:c])); n != c-from || err != nil {
			t.Fatalf("write of %d bytes: %d, %v", c-from, n, err)
		}
		from = c
	}
	if got := string(bytes.Join(out, nil)); got != stream {
		t.Fatalf("the records carry %q, want %q", short(got), short(stream))
	}
	bounds := map[int]bool{}
	at := 0
	for _, r := range out {
		at += len(r)
		bounds[at] = true
	}
	starts, ends := values(t, stream)
	for _, e := range ends {
		if !bounds[e] {
			t.Fatalf("no record ends where the value ending at %d does, in %q cut at %v", e, short(stream), cuts)
		}
	}
	longest := 0
	for _, line := range strings.SplitAfter(stream, "\n") {
		longest = max(longest, len(line))
	}
	at = 0
	for i, r := range out {
		lines := len(r) // the record's bytes outside values
		for v := range starts {
			lines -= max(0, min(at+len(r), ends[v])-max(at, starts[v]))
		}
		if lines > recordLines+longest {
			t.Fatalf("record %d holds %d bytes of lines", i, lines)
		}
		at += len(r)
	}
}

func short(s string) string {
	if len(s) > 120 {
		return s[:60] + "…" + s[len(s)-60:]
	}
	return s
}

func TestRequestRecords(t *testing.T) {
	v := strings.Repeat("x", 1024)
	big := strings.Repeat("y", 40<<10)
	streams := map[string]string{
		"one set":         "set k 0 0 5\r\nhello\r\n",
		"sets and gets":   strings.Repeat("set k 1 0 1024\r\n"+v+"\r\nget k\r\n", 20),
		"every verb":      "add a 0 0 1\r\nx\r\nreplace a 0 0 2\r\nxy\r\nappend a 0 0 1 noreply\r\nz\r\nprepend a 0 0 0\r\n\r\ncas a 0 0 3 77\r\nabc\r\nms a 3 T0 F5\r\nabc\r\nmg a v f t c\r\ndelete a\r\ntouch a 10\r\nincr n 1\r\n",
		"a value of CRLF": "set k 0 0 4\r\n\r\n\r\n\r\nget k\r\n",
		"large value":     "get a\r\nset big 0 0 40960\r\n" + big + "\r\nget big\r\n",
		"many gets":       strings.Repeat("get "+strings.Repeat("k", 200)+"\r\n", 160),
		"mg lines":        strings.Repeat("mg "+strings.Repeat("m", 100)+" v f t c\r\n", 300),
	}
	for name, stream := range streams {
		t.Run(name, func(t *testing.T) {
			checkRecords(t, stream, nil)
			// Every cut of the stream into two writes, and into writes of
			// every size up to 64 bytes.
			step := max(1, len(stream)/300)
			for c := 0; c <= len(stream); c += step {
				checkRecords(t, stream, []int{c})
			}
			for size := 1; size <= 64; size++ {
				var cuts []int
				for c := size; c < len(stream); c += size {
					cuts = append(cuts, c)
				}
				checkRecords(t, stream, cuts)
			}
		})
	}
}

// A batch of sets ends a record at each value: the records are the sets,
// one each.
func TestRequestRecordsEndAtValues(t *testing.T) {
	var out records
	batch := strings.Repeat("set k 0 0 3\r\nabc\r\n", 4) + "get k\r\n"
	RequestRecords(&out).Write([]byte(batch))
	want := []string{"set k 0 0 3\r\nabc\r\n", "set k 0 0 3\r\nabc\r\n", "set k 0 0 3\r\nabc\r\n", "set k 0 0 3\r\nabc\r\n", "get k\r\n"}
	if got := fmt.Sprintf("%q", out); got != fmt.Sprintf("%q", want) {
		t.Errorf("records %s, want %q", got, want)
	}
}

// FuzzRequestRecords builds a stream of well-formed requests from data,
// cuts it into writes at cuts, and checks the records.
func FuzzRequestRecords(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, []byte{3, 17, 200})
	f.Add([]byte{9, 200, 13, 255, 0}, []byte{1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		var b strings.Builder
		for i, d := range data {
			key := "k" + strconv.Itoa(i)
			size := int(d) * 37 % 20000
			switch d % 6 {
			case 0:
				fmt.Fprintf(&b, "set %s 0 0 %d\r\n%s\r\n", key, size, strings.Repeat("\n", size))
			case 1:
				fmt.Fprintf(&b, "cas %s 1 2 %d 99 noreply\r\n%s\r\n", key, size, strings.Repeat("v", size))
			case 2:
				fmt.Fprintf(&b, "ms %s %d T0\r\n%s\r\n", key, size, strings.Repeat("\r", size))
			case 3:
				fmt.Fprintf(&b, "get %s\r\n", strings.Repeat(key+" ", 1+size%300))
			case 4:
				fmt.Fprintf(&b, "mg %s v f t c\r\n", key)
			default:
				fmt.Fprintf(&b, "delete %s\r\n", key)
			}
		}
		stream := b.String()
		var at []int
		c := 0
		for _, d := range cuts {
			c += int(d) * 13
			at = append(at, c)
		}
		checkRecords(t, stream, at)
	})
}
