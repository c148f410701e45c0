package proxy

import (
	"bytes"
	"testing"
)

// TestReserveReusesTheSmallestKeptArenaThatFits: a long reply is opened
// into the smallest arena the loop kept that holds it, with what the slot
// already wrote moved along; a new long arena is sized up to a power of
// two so that it serves later replies once kept, and one past what the
// loop keeps is sized to fit.
func TestReserveReusesTheSmallestKeptArenaThatFits(t *testing.T) {
	ls := &loopState{}
	big, small := make([]byte, 0, 4<<20), make([]byte, 0, 2<<20)
	ls.arenas = [][]byte{big, small, make([]byte, 0, loopBufLimit+1)}
	slot := func() *loopSlot {
		return &loopSlot{client: &loopClient{ls: ls}, arena: append(make([]byte, 0, 64), "VALUE k 0 1\r\nx\r\n"...)}
	}

	s := slot()
	s.reserve(1<<20 + 100)
	if cap(s.arena) != 2<<20 || &s.arena[:1][0] != &small[:1][0] {
		t.Fatalf("reserved an arena of %d bytes, want the kept one of %d", cap(s.arena), 2<<20)
	}
	if !bytes.Equal(s.arena, []byte("VALUE k 0 1\r\nx\r\n")) {
		t.Fatalf("the slot's blocks became %q", s.arena)
	}
	if len(ls.arenas) != 2 || cap(ls.arenas[0]) != 4<<20 || cap(ls.arenas[1]) != loopBufLimit+1 {
		t.Fatalf("kept arenas left: %d", len(ls.arenas))
	}

	s = slot()
	s.reserve(5 << 20)
	if cap(s.arena) != 8<<20 || len(ls.arenas) != 2 {
		t.Fatalf("a new long arena of %d bytes (%d kept), want %d", cap(s.arena), len(ls.arenas), 8<<20)
	}

	s = slot()
	s.reserve(loopArenaKeep + 1)
	if n := cap(s.arena); n < loopArenaKeep+1+len("VALUE k 0 1\r\nx\r\n") || n >= 2*loopArenaKeep {
		t.Fatalf("an arena past what is kept has %d bytes", n)
	}

	s = slot()
	s.reserve(10)
	if cap(s.arena) != 64 || len(ls.arenas) != 2 {
		t.Fatalf("room the arena had was not used: %d bytes, %d kept", cap(s.arena), len(ls.arenas))
	}
}
