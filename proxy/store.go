package proxy

import (
	"bytes"
	"math"
	"strconv"

	"mcsidecar/proxy/internal/wire"
)

// storageVerbs names the storage commands upstream.
var storageVerbs = [numCommands]string{cmdSet: "set", cmdAdd: "add", cmdReplace: "replace", cmdAppend: "append", cmdPrepend: "prepend", cmdCas: "cas"}

// appendStorage appends the line of a storage command: "<verb> <key>
// <flags> <exptime> <bytes> [<cas>]". It never asks for noreply: on a
// connection shared by many clients every request is answered, so replies
// stay matched to requests; a client's noreply only drops the answer.
func appendStorage(dst []byte, verb, key string, flags uint32, exptime int32, size int, cas uint64, withCAS bool) []byte {
	dst = append(dst, verb...)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(flags), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(exptime), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if withCAS {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, cas, 10)
	}
	return append(dst, crlf...)
}

var noreplyWord = []byte("noreply")

// storeArgs are the arguments of a storage command line.
type storeArgs struct {
	key     []byte
	flags   uint32
	exptime int32
	vlen    int
	cas     uint64
	noreply bool
	lenOK   bool // the data block's length is known, so it can be consumed
	argsOK  bool // every argument but the key is valid
	ok      bool // every argument is valid, the key by memcached's own limits
}

// parseStoreArgs reads "<verb> <key> <flags> <exptime> <bytes> [<cas>]
// [noreply]" with memcached's rules. Keys it cannot forward fail here too.
func parseStoreArgs(w [][]byte, withCAS bool) storeArgs {
	var a storeArgs
	var okFlags, okExp, okCas bool
	var vlen int32
	a.key = w[1]
	a.noreply = bytes.Equal(w[len(w)-1], noreplyWord)
	a.flags, okFlags = wire.ParseUint32(w[2])
	a.exptime, okExp = wire.ParseInt32(w[3])
	vlen, a.lenOK = wire.ParseInt32(w[4])
	a.lenOK = a.lenOK && vlen >= 0 && vlen <= math.MaxInt32-2
	a.vlen = int(vlen)
	okCas = true
	if withCAS {
		a.cas, okCas = wire.ParseUint64(w[5])
	}
	a.argsOK = okFlags && okExp && a.lenOK && okCas
	a.ok = a.argsOK && len(a.key) <= keyMaxLength && forwardable(a.key)
	return a
}
