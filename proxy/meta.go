package proxy

// Meta replies, as memcached 1.6 writes them.
var (
	metaValue = []byte("VA ")
	metaMiss  = []byte("EN\r\n")
)

// storedWithCAS begins memcached's answer to a meta set that asked for
// the new CAS value ("HD c<cas>").
var storedWithCAS = []byte("HD c")
