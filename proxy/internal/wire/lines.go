package wire

// The reply lines memcached writes, and the few the sidecar writes of its
// own, byte for byte.

// Fixed replies, written exactly as memcached 1.6 writes them.
var (
	LineStored         = []byte("STORED\r\n")
	LineNotStored      = []byte("NOT_STORED\r\n")
	LineExists         = []byte("EXISTS\r\n")
	LineNotFound       = []byte("NOT_FOUND\r\n")
	LineDeleted        = []byte("DELETED\r\n")
	LineTouched        = []byte("TOUCHED\r\n")
	LineEnd            = []byte("END\r\n")
	LineOK             = []byte("OK\r\n")
	LineReset          = []byte("RESET\r\n")
	LineError          = []byte("ERROR\r\n")
	LineBadFormat      = []byte("CLIENT_ERROR bad command line format\r\n")
	LineBadChunk       = []byte("CLIENT_ERROR bad data chunk\r\n")
	LineBadExptime     = []byte("CLIENT_ERROR invalid exptime argument\r\n")
	LineBadDelta       = []byte("CLIENT_ERROR invalid numeric delta argument\r\n")
	LineBadDeleteUsage = []byte("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n")
	LineTooLarge       = []byte("SERVER_ERROR object too large for cache\r\n")
	LineNonNumeric     = []byte("CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")
	LineTooManyConns   = []byte("ERROR Too many open connections\r\n")
	// The proxy's own: a read-modify-write of an enveloped item lost the
	// race against other writes rmwAttempts times in a row.
	LineContended    = []byte("SERVER_ERROR too many concurrent updates\r\n")
	LineUpstreamDown = []byte("SERVER_ERROR upstream unavailable\r\n")
	LineUpstreamSlow = []byte("SERVER_ERROR upstream timeout\r\n")
	LineValue        = []byte("VALUE ")
	LineStat         = []byte("STAT ")
	CRLF             = []byte("\r\n")
)

// Meta replies, as memcached 1.6 writes them.
var (
	LineMetaValue = []byte("VA ")
	LineMetaMiss  = []byte("EN\r\n")
)

// LineStoredWithCAS begins memcached's answer to a meta set that asked for
// the new CAS value ("HD c<cas>").
var LineStoredWithCAS = []byte("HD c")

// KeyMaxLength is memcached's KEY_MAX_LENGTH: the longest key it stores.
const KeyMaxLength = 250

// Forwardable reports whether key can go upstream as it is in a text
// command: control bytes, spaces and DEL would break the line (gomemcache,
// the upstream client the sidecar started on, refuses them too).
func Forwardable(key []byte) bool {
	for _, b := range key {
		if b <= ' ' || b == 0x7f {
			return false
		}
	}
	return true
}
