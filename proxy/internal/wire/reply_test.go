package wire

import "testing"

func TestReplyFamilies(t *testing.T) {
	for _, tc := range []struct {
		req  string
		line string
		fits bool
	}{
		{"set k 0 0 1\r\n", "STORED\r\n", true},
		{"add k 0 0 1\r\n", "NOT_STORED\r\n", true},
		{"cas k 0 0 1 5\r\n", "EXISTS\r\n", true},
		{"cas k 0 0 1 5\r\n", "NOT_FOUND\r\n", true},
		{"set k 0 0 1\r\n", "SERVER_ERROR object too large for cache\r\n", true},
		{"set k 0 0 1\r\n", "CLIENT_ERROR bad data chunk\r\n", true},
		{"set k 0 0 1\r\n", "SERVER_ERROR out of memory writing get response\r\n", false},
		{"set k 0 0 1\r\n", "SERVER_ERROR out of memory storing object\r\n", false},
		{"set k 0 0 1\r\n", "VALUE k 0 1\r\n", false},
		{"set k 0 0 1\r\n", "END\r\n", false},
		{"set k 0 0 1\r\n", "DELETED\r\n", false},
		{"set k 0 0 1\r\n", "1001\r\n", false},
		{"set k 0 0 1\r\n", "ERROR\r\n", false},
		{"set k 0 0 1\r\n", "STORED", false},
		{"delete k\r\n", "DELETED\r\n", true},
		{"delete k\r\n", "NOT_FOUND\r\n", true},
		{"delete k\r\n", "STORED\r\n", false},
		{"touch k 10\r\n", "TOUCHED\r\n", true},
		{"touch k 10\r\n", "42\r\n", false},
		{"incr k 1\r\n", "42\r\n", true},
		{"decr k 1\r\n", "18446744073709551615\r\n", true},
		{"incr k 1\r\n", "18446744073709551616\r\n", false},
		{"incr k 1\r\n", "NOT_FOUND\r\n", true},
		{"incr k 1\r\n", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", true},
		{"incr k 1\r\n", "TOUCHED\r\n", false},
		{"incr k 1\r\n", "\r\n", false},
		{"incr k 1\r\n", "4 2\r\n", false},
		{"flush_all\r\n", "OK\r\n", true},
		{"version\r\n", "VERSION 1.6.18\r\n", true},
		{"mg k v\r\n", "VA 2 f0\r\n", true},
		{"mg k v\r\n", "EN\r\n", true},
		{"mg k\r\n", "HD\r\n", true},
		{"mg k v\r\n", "NF\r\n", false},
		{"ms k 2 c\r\n", "HD c5\r\n", true},
		{"ms k 2\r\n", "NS\r\n", true},
		{"ms k 2\r\n", "VA 2\r\n", false},
		{"md k\r\n", "NF\r\n", true},
		{"ma k v\r\n", "VA 1\r\n", true},
		{"mn\r\n", "MN\r\n", true},
		{"mn\r\n", "HD\r\n", false},
		{"me k\r\n", "ME k exp=-1 la=1 cas=2 fetch=no cls=1 size=63\r\n", true},
		{"mg k v\r\n", "HDX\r\n", false},
		{"bogus\r\n", "anything\r\n", true},
	} {
		if got := ReplyOf([]byte(tc.req)).Fits([]byte(tc.line)); got != tc.fits {
			t.Errorf("a %q answered %q: fits %v, want %v", tc.req, tc.line, got, tc.fits)
		}
	}
}

func TestReplyOfAllocatesNothing(t *testing.T) {
	req := []byte("delete somekey\r\n")
	line := []byte("DELETED\r\n")
	if n := testing.AllocsPerRun(100, func() { ReplyOf(req).Fits(line) }); n != 0 {
		t.Errorf("%v allocations a check, want none", n)
	}
}

func TestArithTaggedReplies(t *testing.T) {
	req := string(AppendArith(nil, true, []byte("k"), 5, 77))
	if req != "ma k D5 MI v O77\r\n" {
		t.Fatalf("request %q", req)
	}
	if req := string(AppendArith(nil, false, []byte("k"), 18446744073709551615, 1)); req != "ma k D18446744073709551615 MD v O1\r\n" {
		t.Fatalf("request %q", req)
	}
	for _, tc := range []struct {
		reply, classic string
		ok             bool
	}{
		{"VA 2 O77\r\n15\r\n", "15\r\n", true},
		{"NF O77\r\n", "NOT_FOUND\r\n", true},
		{"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", true},
		{"VA 2 O78\r\n15\r\n", "", false}, // another request's number
		{"NF O7\r\n", "", false},          // another request's miss
		{"VA 2\r\n15\r\n", "", false},     // no tag
		{"HD O77\r\n", "", false},         // not asked with v
		{"VA 2 O77\r\nab\r\n", "", false}, // not a number
		{"STORED\r\n", "", false},         // another command's reply
		{"15\r\n", "", false},             // a classic incr's reply
		{"SERVER_ERROR out of memory writing get response\r\n", "", false},
	} {
		got, ok := ArithReply([]byte(tc.reply), 77)
		if ok != tc.ok || string(got) != tc.classic {
			t.Errorf("%q: %q, %v; want %q, %v", tc.reply, got, ok, tc.classic, tc.ok)
		}
	}
	if n, ok := ArithLine([]byte("VA 2 O77\r\n")); !ok || n != 4 {
		t.Errorf("ArithLine: %d, %v", n, ok)
	}
}
