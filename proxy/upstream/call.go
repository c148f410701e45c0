package upstream

import "time"

// Call is one client request's work on one server: its share of the keys
// of a get, or one command with a one-line reply (a storage command,
// delete, touch, incr or decr). A connection keeps one per server, and one
// for commands, and reuses them, buffers included, so a request costs no
// allocation here once the buffers have grown.
type Call struct {
	Keys  []string
	Items []Item // one per key, in key order
	Arena []byte // the values of Items
	// A command rather than a get: its line, its data block (nil for
	// none; it stays unchanged until the call is done), and the line
	// memcached answered. A meta command answered "VA <size> …" has its
	// data block read into Arena.
	Req, Data, Reply []byte
	// Replies is how many reply lines Req asks for, when it holds more
	// than one command (fills); 0 is one.
	Replies int
	Err     error

	done chan signal
	// queued is when the call began to wait in line, if it did.
	queued time.Time

	// Scratch for when this call leads a batch.
	batch []*Call
	// A batch Begin or Send started, to be finished by End or Finish:
	// its keys, when it began, and the connection it is on.
	led   int
	began time.Time
	pend  pending
}

// Item is one key's result: a hit's flags, CAS and where its value sits in
// the call's arena.
type Item struct {
	Hit    bool
	Flags  uint32
	CAS    uint64
	TTL    int32 // seconds left to live (-1: forever); meta retrievals only
	Off, N int
}

// Retrieval says which retrieval command to send upstream.
type Retrieval struct {
	Touch   bool  // gat or gats
	Exptime int32 // the new expiration time, with Touch
	// Meta asks with one mg per key, which also returns each hit's time
	// to live: for a read from another zone, whose hits are filled into
	// the local one.
	Meta bool
}

// ArenaKeep is the largest value buffer a connection keeps between
// requests; a bigger one, grown by a large reply, is left to the collector.
const ArenaKeep = 1 << 20

// signal tells a waiting call what happened to it.
type signal uint8

const (
	signalDone signal = iota // items and err are set
	signalLead               // fetch the next batch yourself
)

// NewCall returns an empty call, ready for its first request.
func NewCall() *Call { return &Call{done: make(chan signal, 1)} }

// Reset empties the call for the next request.
func (c *Call) Reset() {
	c.Req, c.Data, c.Replies = nil, nil, 0
	c.Reply = c.Reply[:0]
	c.Keys = c.Keys[:0]
	c.Items = c.Items[:0]
	if cap(c.Arena) > ArenaKeep {
		c.Arena = nil
	}
	c.Arena = c.Arena[:0]
	c.Err = nil
}

// Value returns the value of item i.
func (c *Call) Value(i int) []byte {
	it := &c.Items[i]
	return c.Arena[it.Off : it.Off+it.N]
}

// Grown reports whether the call's keys or its batch outgrew n entries,
// for a connection to let go of a call a large request left behind.
func (c *Call) Grown(n int) bool { return cap(c.Keys) > n || cap(c.batch) > n }

// WriteNow writes the batch that Begin or Send gathered for the call at
// once, rather than as End or Finish begins to read its replies: for a
// request over several servers, whose batches all go out before it reads
// any reply.
func (c *Call) WriteNow() { c.pend.writeNow() }
