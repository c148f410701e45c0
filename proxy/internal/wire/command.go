package wire

import (
	"bytes"
	"strings"
)

// Command is one row of the command table: the verb, and how many words
// its line may have (the verb included, as memcached counts them). The
// table's ids also bound the metrics' command label.
type Command struct {
	ID       int
	Name     string
	MinWords int
	MaxWords int // 0: no limit (retrieval commands take any number of keys)
}

// Command ids, in table order.
const (
	CmdGet = iota
	CmdGets
	CmdGat
	CmdGats
	CmdSet
	CmdAdd
	CmdReplace
	CmdAppend
	CmdPrepend
	CmdCas
	CmdIncr
	CmdDecr
	CmdTouch
	CmdDelete
	CmdFlushAll
	CmdVersion
	CmdVerbosity
	CmdStats
	CmdQuit
	CmdMetaGet
	CmdMetaSet
	CmdMetaDelete
	CmdMetaArithmetic
	CmdMetaNoop
	CmdMetaDebug
	CmdUnknown // not a command: counts requests answered ERROR
	NumCommands
)

// Commands is the command table. The word counts are memcached's token
// checks (WANT_TOKENS*) less its terminal token; a line over its count is
// answered ERROR, as memcached does.
var Commands = numbered([NumCommands]Command{
	CmdGet:       {Name: "get", MinWords: 2},
	CmdGets:      {Name: "gets", MinWords: 2},
	CmdGat:       {Name: "gat", MinWords: 2},
	CmdGats:      {Name: "gats", MinWords: 2},
	CmdSet:       {Name: "set", MinWords: 5, MaxWords: 6},
	CmdAdd:       {Name: "add", MinWords: 5, MaxWords: 6},
	CmdReplace:   {Name: "replace", MinWords: 5, MaxWords: 6},
	CmdAppend:    {Name: "append", MinWords: 5, MaxWords: 6},
	CmdPrepend:   {Name: "prepend", MinWords: 5, MaxWords: 6},
	CmdCas:       {Name: "cas", MinWords: 6, MaxWords: 7},
	CmdIncr:      {Name: "incr", MinWords: 3, MaxWords: 4},
	CmdDecr:      {Name: "decr", MinWords: 3, MaxWords: 4},
	CmdTouch:     {Name: "touch", MinWords: 3, MaxWords: 4},
	CmdDelete:    {Name: "delete", MinWords: 2, MaxWords: 4},
	CmdFlushAll:  {Name: "flush_all", MinWords: 1, MaxWords: 3},
	CmdVersion:   {Name: "version", MinWords: 1},
	CmdVerbosity: {Name: "verbosity", MinWords: 2, MaxWords: 3},
	CmdStats:     {Name: "stats", MinWords: 1},
	CmdQuit:      {Name: "quit", MinWords: 1},
	// The meta commands take up to memcached's token limit; metaReq
	// refuses more flags than memcached reads.
	CmdMetaGet:        {Name: "mg", MinWords: 2, MaxWords: MaxTokens},
	CmdMetaSet:        {Name: "ms", MinWords: 2, MaxWords: MaxTokens},
	CmdMetaDelete:     {Name: "md", MinWords: 2, MaxWords: MaxTokens},
	CmdMetaArithmetic: {Name: "ma", MinWords: 2, MaxWords: MaxTokens},
	CmdMetaNoop:       {Name: "mn", MinWords: 1, MaxWords: MaxTokens},
	CmdMetaDebug:      {Name: "me", MinWords: 1, MaxWords: MaxTokens},
	CmdUnknown:        {Name: "unknown"},
})

// numbered sets each command's id to its index in the table.
func numbered(t [NumCommands]Command) [NumCommands]Command {
	for i := range t {
		t[i].ID = i
	}
	return t
}

// byVerb finds a command by its verb. "bget" is memcached's ancient alias
// of get, still accepted; "unknown" is not a verb. It scans the table in
// its order, where get and set come early: for verbs this short that
// costs less than hashing one for a map.
func byVerb(v []byte) *Command {
	for i := range Commands[:CmdUnknown] {
		if string(v) == Commands[i].Name {
			return &Commands[i]
		}
	}
	if string(v) == "bget" {
		return &Commands[CmdGet]
	}
	return nil
}

// Verdict is what parsing decided about a line before any handler runs.
type Verdict uint8

const (
	VerdictRun     Verdict = iota // run the command's handler
	VerdictUnknown                // answer ERROR: not a command
	VerdictBadArgs                // answer ERROR: wrong number of words
	VerdictClose                  // hang up, as memcached does on HTTP
)

// MaxTokens mirrors memcached's MAX_TOKENS: it tokenizes at most 23 words of
// a command line plus a terminal token, and every non-retrieval command is
// validated against that count.
const MaxTokens = 24

// ParseLine splits line into words (sub-slices of line, appended to dst)
// and finds its command, applying memcached's checks of the verb and word
// count. It allocates nothing once dst has room for MaxTokens words.
func ParseLine(dst [][]byte, line []byte) (*Command, [][]byte, Verdict) {
	words, overflow := Tokenize(dst, line, MaxTokens-1)
	if len(words) == 0 || len(words[0]) < 2 {
		return nil, words, VerdictUnknown
	}
	cmd := byVerb(words[0])
	if cmd == nil {
		// memcached hangs up on what looks like an HTTP request, but only
		// when its verb dispatch found no family for the first letter.
		v := words[0]
		family := strings.IndexByte("gsacidt", v[0]) >= 0 || v[0] == 'm' && len(v) == 2
		if !family && bytes.HasPrefix(words[len(words)-1], []byte("HTTP/")) {
			return nil, words, VerdictClose
		}
		return nil, words, VerdictUnknown
	}
	n := len(words)
	if overflow {
		if cmd.MaxWords == 0 {
			words, _ = Tokenize(words, line, len(line))
			n = len(words)
		} else {
			n = MaxTokens
		}
	}
	if n < cmd.MinWords || cmd.MaxWords > 0 && n > cmd.MaxWords {
		return cmd, words, VerdictBadArgs
	}
	return cmd, words, VerdictRun
}
