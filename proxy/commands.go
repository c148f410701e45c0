package proxy

import (
	"bytes"
	"strings"

	"mcsidecar/proxy/internal/wire"
)

// command is one row of the command table: the verb, how many words its
// line may have (the verb included, as memcached counts them), and for
// those the proxy answers itself, its answer. The table also bounds the metrics' command label.
type command struct {
	id       int
	name     string
	minWords int
	maxWords int // 0: no limit (retrieval commands take any number of keys)
	// local answers a command that asks memcached nothing (version,
	// verbosity, stats, mn); nil for the others, which the loop sends.
	local func(c *conn, words [][]byte)
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
	cmdGet:       {name: "get", minWords: 2},
	cmdGets:      {name: "gets", minWords: 2},
	cmdGat:       {name: "gat", minWords: 2},
	cmdGats:      {name: "gats", minWords: 2},
	cmdSet:       {name: "set", minWords: 5, maxWords: 6},
	cmdAdd:       {name: "add", minWords: 5, maxWords: 6},
	cmdReplace:   {name: "replace", minWords: 5, maxWords: 6},
	cmdAppend:    {name: "append", minWords: 5, maxWords: 6},
	cmdPrepend:   {name: "prepend", minWords: 5, maxWords: 6},
	cmdCas:       {name: "cas", minWords: 6, maxWords: 7},
	cmdIncr:      {name: "incr", minWords: 3, maxWords: 4},
	cmdDecr:      {name: "decr", minWords: 3, maxWords: 4},
	cmdTouch:     {name: "touch", minWords: 3, maxWords: 4},
	cmdDelete:    {name: "delete", minWords: 2, maxWords: 4},
	cmdFlushAll:  {name: "flush_all", minWords: 1, maxWords: 3},
	cmdVersion:   {name: "version", minWords: 1, local: (*conn).version},
	cmdVerbosity: {name: "verbosity", minWords: 2, maxWords: 3, local: (*conn).verbosity},
	cmdStats:     {name: "stats", minWords: 1, local: (*conn).stats},
	cmdQuit:      {name: "quit", minWords: 1},
	// The meta commands take up to memcached's token limit; metaReq
	// refuses more flags than memcached reads.
	cmdMetaGet:        {name: "mg", minWords: 2, maxWords: maxTokens},
	cmdMetaSet:        {name: "ms", minWords: 2, maxWords: maxTokens},
	cmdMetaDelete:     {name: "md", minWords: 2, maxWords: maxTokens},
	cmdMetaArithmetic: {name: "ma", minWords: 2, maxWords: maxTokens},
	cmdMetaNoop:       {name: "mn", minWords: 1, maxWords: maxTokens, local: (*conn).metaNoop},
	cmdMetaDebug:      {name: "me", minWords: 1, maxWords: maxTokens},
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
