package proxy

import (
	"bytes"
	"strings"
	"time"

	"mcsidecar/proxy/internal/wire"
)

// command is one row of the command table: the verb, how many words its
// line may have (the verb included, as memcached counts them), and its
// handler. The table also bounds the metrics' command label.
type command struct {
	id       int
	name     string
	minWords int
	maxWords int // 0: no limit (retrieval commands take any number of keys)
	run      func(c *conn, words [][]byte) error
}

// Command ids, in table order.
const (
	cmdGet = iota
	cmdGets
	cmdGat
	cmdGats
	cmdSet
	cmdAdd
	cmdReplace
	cmdAppend
	cmdPrepend
	cmdCas
	cmdIncr
	cmdDecr
	cmdTouch
	cmdDelete
	cmdFlushAll
	cmdVersion
	cmdVerbosity
	cmdStats
	cmdQuit
	cmdMetaGet
	cmdMetaSet
	cmdMetaDelete
	cmdMetaArithmetic
	cmdMetaNoop
	cmdMetaDebug
	cmdUnknown // not a command: counts requests answered ERROR
	numCommands
)

// commands is the command table. The word counts are memcached's token
// checks (WANT_TOKENS*) less its terminal token; a line over its count is
// answered ERROR, as memcached does.
var commands = numbered([numCommands]command{
	cmdGet:       {name: "get", minWords: 2, run: func(c *conn, w [][]byte) error { return c.retrieve(w[1:], false) }},
	cmdGets:      {name: "gets", minWords: 2, run: func(c *conn, w [][]byte) error { return c.retrieve(w[1:], true) }},
	cmdGat:       {name: "gat", minWords: 2, run: func(c *conn, w [][]byte) error { return c.getAndTouch(w[1:], false) }},
	cmdGats:      {name: "gats", minWords: 2, run: func(c *conn, w [][]byte) error { return c.getAndTouch(w[1:], true) }},
	cmdSet:       {name: "set", minWords: 5, maxWords: 6, run: func(c *conn, w [][]byte) error { return c.store(cmdSet, w) }},
	cmdAdd:       {name: "add", minWords: 5, maxWords: 6, run: func(c *conn, w [][]byte) error { return c.store(cmdAdd, w) }},
	cmdReplace:   {name: "replace", minWords: 5, maxWords: 6, run: func(c *conn, w [][]byte) error { return c.store(cmdReplace, w) }},
	cmdAppend:    {name: "append", minWords: 5, maxWords: 6, run: func(c *conn, w [][]byte) error { return c.store(cmdAppend, w) }},
	cmdPrepend:   {name: "prepend", minWords: 5, maxWords: 6, run: func(c *conn, w [][]byte) error { return c.store(cmdPrepend, w) }},
	cmdCas:       {name: "cas", minWords: 6, maxWords: 7, run: func(c *conn, w [][]byte) error { return c.store(cmdCas, w) }},
	cmdIncr:      {name: "incr", minWords: 3, maxWords: 4, run: func(c *conn, w [][]byte) error { return c.arithmetic(w, true) }},
	cmdDecr:      {name: "decr", minWords: 3, maxWords: 4, run: func(c *conn, w [][]byte) error { return c.arithmetic(w, false) }},
	cmdTouch:     {name: "touch", minWords: 3, maxWords: 4, run: (*conn).touch},
	cmdDelete:    {name: "delete", minWords: 2, maxWords: 4, run: (*conn).delete},
	cmdFlushAll:  {name: "flush_all", minWords: 1, maxWords: 3, run: (*conn).flushAll},
	cmdVersion:   {name: "version", minWords: 1, run: (*conn).version},
	cmdVerbosity: {name: "verbosity", minWords: 2, maxWords: 3, run: (*conn).verbosity},
	cmdStats:     {name: "stats", minWords: 1, run: (*conn).stats},
	cmdQuit:      {name: "quit", minWords: 1, run: (*conn).quit},
	// The meta commands take up to memcached's token limit; metaReq
	// refuses more flags than memcached reads.
	cmdMetaGet:        {name: "mg", minWords: 2, maxWords: maxTokens, run: (*conn).metaGet},
	cmdMetaSet:        {name: "ms", minWords: 2, maxWords: maxTokens, run: (*conn).metaSet},
	cmdMetaDelete:     {name: "md", minWords: 2, maxWords: maxTokens, run: (*conn).metaDelete},
	cmdMetaArithmetic: {name: "ma", minWords: 2, maxWords: maxTokens, run: (*conn).metaArithmetic},
	cmdMetaNoop:       {name: "mn", minWords: 1, maxWords: maxTokens, run: (*conn).metaNoop},
	cmdMetaDebug:      {name: "me", minWords: 1, maxWords: maxTokens, run: (*conn).metaDebug},
	cmdUnknown:        {name: "unknown"},
})

// numbered sets each command's id to its index in the table.
func numbered(t [numCommands]command) [numCommands]command {
	for i := range t {
		t[i].id = i
	}
	return t
}

// byVerb finds a command by its verb. "bget" is memcached's ancient alias
// of get, still accepted; "unknown" is not a verb. It scans the table in
// its order, where get and set come early: for verbs this short that
// costs less than hashing one for a map.
func byVerb(v []byte) *command {
	for i := range commands[:cmdUnknown] {
		if string(v) == commands[i].name {
			return &commands[i]
		}
	}
	if string(v) == "bget" {
		return &commands[cmdGet]
	}
	return nil
}

// verdict is what parsing decided about a line before any handler runs.
type verdict uint8

const (
	verdictRun     verdict = iota // run the command's handler
	verdictUnknown                // answer ERROR: not a command
	verdictBadArgs                // answer ERROR: wrong number of words
	verdictClose                  // hang up, as memcached does on HTTP
)

// maxTokens mirrors memcached's MAX_TOKENS: it tokenizes at most 23 words of
// a command line plus a terminal token, and every non-retrieval command is
// validated against that count.
const maxTokens = 24

// parseLine splits line into words (sub-slices of line, appended to dst)
// and finds its command, applying memcached's checks of the verb and word
// count. It allocates nothing once dst has room for maxTokens words.
func parseLine(dst [][]byte, line []byte) (*command, [][]byte, verdict) {
	words, overflow := wire.Tokenize(dst, line, maxTokens-1)
	if len(words) == 0 || len(words[0]) < 2 {
		return nil, words, verdictUnknown
	}
	cmd := byVerb(words[0])
	if cmd == nil {
		// memcached hangs up on what looks like an HTTP request, but only
		// when its verb dispatch found no family for the first letter.
		v := words[0]
		family := strings.IndexByte("gsacidt", v[0]) >= 0 || v[0] == 'm' && len(v) == 2
		if !family && bytes.HasPrefix(words[len(words)-1], []byte("HTTP/")) {
			return nil, words, verdictClose
		}
		return nil, words, verdictUnknown
	}
	n := len(words)
	if overflow {
		if cmd.maxWords == 0 {
			words, _ = wire.Tokenize(words, line, len(line))
			n = len(words)
		} else {
			n = maxTokens
		}
	}
	if n < cmd.minWords || cmd.maxWords > 0 && n > cmd.maxWords {
		return cmd, words, verdictBadArgs
	}
	return cmd, words, verdictRun
}

// dispatch parses one command line and runs it. It returns an error only
// when the connection must close, or errNeedMore, with the line put back
// (it starts at start in the read buffer), when the command's data block
// has not all arrived yet.
func (c *conn) dispatch(line []byte, start int) error {
	c.noreply = false
	cmd, words, v := parseLine(c.words, line)
	c.words = words
	switch v {
	case verdictClose:
		// memcached sends nothing more, not even earlier replies.
		c.wr.reset(c.cc)
		return errQuit
	case verdictUnknown:
		return c.clientError(cmdUnknown, replyError)
	case verdictBadArgs:
		return c.clientError(cmd.id, replyError)
	}
	if cmd.id != cmdMetaGet {
		c.ahead.drop() // it may write: what was read ahead is older
	}
	c.useUpstreams()
	c.lineStart = start
	began := time.Now()
	c.lastCmd.Store(began.UnixNano())
	err := cmd.run(c, words)
	if err != errNeedMore {
		c.p.stats.latency[cmd.id].Observe(time.Since(began).Seconds())
	}
	return err
}

// awaitBlock reports whether the n bytes of a data block, after the line
// being handled, are still arriving; it then puts the line back and tells
// the reader how many bytes to wait for, so the command runs again, from
// the start, once they are all here. A handler calls it before it counts
// or answers anything, and a command runs only once its block is buffered:
// no handler waits for a client. A block longer than any value the proxy
// takes is not waited for: its command is refused at once and the block
// dropped as it arrives.
func (c *conn) awaitBlock(n int) bool {
	if n > c.p.cfg.maxValueSize()+2 || c.rd.buffered(n) {
		c.rd.want = 0
		return false
	}
	c.rd.want = c.rd.r - c.lineStart + n
	c.rd.r = c.lineStart
	return true
}
