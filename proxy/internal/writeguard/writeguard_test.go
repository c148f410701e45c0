package writeguard

import (
	"testing"
	"time"
)

func TestNilGuardKeepsNothing(t *testing.T) {
	var g *Guard
	k := []byte("k")
	if n := g.Note(k); n != Never {
		t.Errorf("a nil guard noted %d", n)
	}
	if n := g.NoteString("k"); n != Never {
		t.Errorf("a nil guard noted %d", n)
	}
	g.Writing(k)
	g.Wrote(k)
	g.Flushing(10, true)
	g.Flushed()
}

// TestAWriteBetweenNoteAndStoreIsSeen follows a read and the writes that
// may run while it waits for memcached, as the tier and zone fills ask.
func TestAWriteBetweenNoteAndStoreIsSeen(t *testing.T) {
	g := new(Guard)
	k, other := []byte("P2:tenant:block:1"), []byte("P2:tenant:block:2")
	for g.stripe(other) == g.stripe(k) {
		other = append(other, '0')
	}
	n := g.Note(k)
	if n == Never || g.WroteSince(k, n) || g.WroteSinceString(string(k), n) {
		t.Fatalf("a quiet key noted %d, written since: %v", n, g.WroteSince(k, n))
	}
	g.Writing(other)
	g.Wrote(other)
	if g.WroteSince(k, n) {
		t.Error("a write to a key of another stripe counted")
	}
	g.Writing(k)
	if g.Note(k) != Never || g.NoteString(string(k)) != Never {
		t.Error("a read noted a key whose write is under way")
	}
	if !g.WroteSince(k, n) {
		t.Error("a write begun since the note was not seen")
	}
	g.Wrote(k)
	if !g.WroteSince(k, n) {
		t.Error("a write begun and ended since the note was not seen")
	}
	if m := g.Note(k); m == Never || m == n {
		t.Errorf("after the write, the key noted %d (before it %d)", m, n)
	}
	if !g.WroteSince(k, Never) {
		t.Error("a read that noted Never may keep what it fetched")
	}
}

// TestOwnWrite: an mg with T writes the key it reads; the read expects
// its own write and no other.
func TestOwnWrite(t *testing.T) {
	g := new(Guard)
	k := []byte("k")
	n := g.Note(k)
	g.Writing(k)
	if g.WroteSince(k, OwnWrite(n)) {
		t.Error("the read's own write counted as another's")
	}
	g.Wrote(k)
	if g.WroteSince(k, OwnWriteEnded(OwnWrite(n))) {
		t.Error("the read's own ended write counted as another's")
	}
	if OwnWrite(Never) != Never || OwnWriteEnded(Never) != Never {
		t.Error("Never did not stay Never")
	}
}

func TestFlushAll(t *testing.T) {
	g := new(Guard)
	k := []byte("k")
	n := g.Note(k)
	g.Flushing(0, false)
	if g.Note(k) != Never || !g.WroteSince(k, n) {
		t.Error("a flush_all under way left a key quiet")
	}
	g.Flushed()
	if m := g.Note(k); m == Never || m == n {
		t.Errorf("after flush_all the key noted %d (before it %d)", m, n)
	}

	// With a delay, reads keep nothing until memcached surely acted on it.
	g.Flushing(2, true)
	g.Flushed()
	if g.Note(k) != Never {
		t.Error("a read noted a key while a delayed flush_all is pending")
	}
	if until := g.pausedUntil.Load(); until < time.Now().Add(2*time.Second).UnixNano() {
		t.Errorf("paused until %v, under the delay and a second", time.Unix(0, until))
	}
	g.Flushing(1, true) // an earlier end does not shorten the pause
	g.Flushed()
	if until := g.pausedUntil.Load(); until < time.Now().Add(2*time.Second).UnixNano() {
		t.Error("a shorter delay shortened the pause")
	}
	g.pausedUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if g.Note(k) == Never || g.pausedUntil.Load() != 0 {
		t.Error("the pause outlived its end")
	}
}
