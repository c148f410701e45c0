package wire

import "bytes"

// Reply is the family of reply lines memcached answers one request with.
// Many clients' requests share an upstream connection and memcached
// answers them in order, so a reply is matched to its request by place
// alone: a line outside the family of the request in that place means the
// connection is out of step, and the next lines may be other clients'
// replies. Such a connection is closed, never read on.
type Reply uint8

// Families of replies, by the request's verb.
const (
	ReplyAny        Reply = iota // not known: any line
	ReplyStorage                 // set, add, replace, append, prepend, cas
	ReplyDelete                  // delete
	ReplyTouch                   // touch
	ReplyArith                   // incr, decr
	ReplyOK                      // flush_all, verbosity
	ReplyVersion                 // version
	ReplyMetaGet                 // mg
	ReplyMetaSet                 // ms
	ReplyMetaDelete              // md
	ReplyMetaArith               // ma
	ReplyMetaNoop                // mn
	ReplyMetaDebug               // me
)

// replyVerbs maps a request's verb to its family.
var replyVerbs = map[string]Reply{
	"set": ReplyStorage, "add": ReplyStorage, "replace": ReplyStorage,
	"append": ReplyStorage, "prepend": ReplyStorage, "cas": ReplyStorage,
	"delete": ReplyDelete, "touch": ReplyTouch, "incr": ReplyArith, "decr": ReplyArith,
	"flush_all": ReplyOK, "verbosity": ReplyOK, "version": ReplyVersion,
	"mg": ReplyMetaGet, "ms": ReplyMetaSet, "md": ReplyMetaDelete, "ma": ReplyMetaArith,
	"mn": ReplyMetaNoop, "me": ReplyMetaDebug,
}

// ReplyOf returns the family of replies to the request that begins req.
func ReplyOf(req []byte) Reply {
	verb := req
	if i := bytes.IndexAny(req, " \r\n"); i >= 0 {
		verb = req[:i]
	}
	return replyVerbs[string(verb)] // no allocation: a map index by string(bytes)
}

// The lines the families are made of.
var (
	lineVersion = []byte("VERSION ")
	serverError = []byte("SERVER_ERROR ")
	clientError = []byte("CLIENT_ERROR ")
	outOfMemory = []byte("SERVER_ERROR out of memory")
)

// OutOfStep reports whether line is a reply memcached may send out of
// step with the requests before it. memcached 1.6 answers a get whose
// reply it cannot buffer with "SERVER_ERROR out of memory writing get
// response" after dropping every reply it had not yet written, those of
// earlier requests of the connection included: once it says so, which of
// the requests sent are answered is unknown. Every "out of memory" error
// is taken so, whatever request it seems to answer.
func OutOfStep(line []byte) bool { return bytes.HasPrefix(line, outOfMemory) }

// IsError reports whether line is memcached's SERVER_ERROR or
// CLIENT_ERROR, which it may answer any request with (but see OutOfStep).
func IsError(line []byte) bool {
	return bytes.HasPrefix(line, serverError) || bytes.HasPrefix(line, clientError)
}

// Fits reports whether line, a whole reply line with its CRLF, is one
// memcached can answer a request of family f with. A meta command's data
// block, which follows its line, is not checked here.
func (f Reply) Fits(line []byte) bool {
	if !bytes.HasSuffix(line, CRLF) || OutOfStep(line) {
		return false
	}
	if f == ReplyAny || IsError(line) {
		return true
	}
	switch f {
	case ReplyStorage:
		return bytes.Equal(line, LineStored) || bytes.Equal(line, LineNotStored) ||
			bytes.Equal(line, LineExists) || bytes.Equal(line, LineNotFound)
	case ReplyDelete:
		return bytes.Equal(line, LineDeleted) || bytes.Equal(line, LineNotFound)
	case ReplyTouch:
		return bytes.Equal(line, LineTouched) || bytes.Equal(line, LineNotFound)
	case ReplyArith:
		return bytes.Equal(line, LineNotFound) || isNumberLine(line)
	case ReplyOK:
		return bytes.Equal(line, LineOK)
	case ReplyVersion:
		return bytes.HasPrefix(line, lineVersion)
	case ReplyMetaGet:
		return metaCode(line, "VA", "HD", "EN")
	case ReplyMetaSet:
		return metaCode(line, "HD", "NS", "EX", "NF")
	case ReplyMetaDelete:
		return metaCode(line, "HD", "NF", "EX")
	case ReplyMetaArith:
		return metaCode(line, "VA", "HD", "NF", "NS", "EX")
	case ReplyMetaNoop:
		return metaCode(line, "MN")
	case ReplyMetaDebug:
		return metaCode(line, "ME", "EN")
	}
	return false
}

// isNumberLine reports whether line is an unsigned 64-bit number and CRLF:
// memcached's answer to an incr or decr that took.
func isNumberLine(line []byte) bool {
	_, ok := ParseDecimal(line[:len(line)-2], 1<<64-1)
	return ok
}

// metaCode reports whether line begins with one of the two-letter codes,
// followed by its flags or the end of the line.
func metaCode(line []byte, codes ...string) bool {
	if len(line) < 4 || line[2] != ' ' && line[2] != '\r' {
		return false
	}
	for _, c := range codes {
		if line[0] == c[0] && line[1] == c[1] {
			return true
		}
	}
	return false
}
