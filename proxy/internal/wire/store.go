package wire

import (
	"bytes"
	"math"
	"strconv"
)

// StorageVerbs names the storage commands upstream.
var StorageVerbs = [NumCommands]string{CmdSet: "set", CmdAdd: "add", CmdReplace: "replace", CmdAppend: "append", CmdPrepend: "prepend", CmdCas: "cas"}

// AppendStorage appends the line of a storage command: "<verb> <key>
// <flags> <exptime> <bytes> [<cas>]". It never asks for noreply: on a
// connection shared by many clients every request is answered, so replies
// stay matched to requests; a client's noreply only drops the answer.
func AppendStorage(dst []byte, verb, key string, flags uint32, exptime int32, size int, cas uint64, withCAS bool) []byte {
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
	return append(dst, CRLF...)
}

// NoreplyWord is the last word of a command whose client wants no answer.
var NoreplyWord = []byte("noreply")

// StoreArgs are the arguments of a storage command line.
type StoreArgs struct {
	Key     []byte
	Flags   uint32
	Exptime int32
	Vlen    int
	CAS     uint64
	Noreply bool
	LenOK   bool // the data block's length is known, so it can be consumed
	ArgsOK  bool // every argument but the key is valid
	OK      bool // every argument is valid, the key by memcached's own limits
}

// ParseStoreArgs reads "<verb> <key> <flags> <exptime> <bytes> [<cas>]
// [noreply]" with memcached's rules. Keys it cannot forward fail here too.
func ParseStoreArgs(w [][]byte, withCAS bool) StoreArgs {
	var a StoreArgs
	var okFlags, okExp, okCas bool
	var vlen int32
	a.Key = w[1]
	a.Noreply = bytes.Equal(w[len(w)-1], NoreplyWord)
	a.Flags, okFlags = ParseUint32(w[2])
	a.Exptime, okExp = ParseInt32(w[3])
	vlen, a.LenOK = ParseInt32(w[4])
	a.LenOK = a.LenOK && vlen >= 0 && vlen <= math.MaxInt32-2
	a.Vlen = int(vlen)
	okCas = true
	if withCAS {
		a.CAS, okCas = ParseUint64(w[5])
	}
	a.ArgsOK = okFlags && okExp && a.LenOK && okCas
	a.OK = a.ArgsOK && len(a.Key) <= KeyMaxLength && Forwardable(a.Key)
	return a
}
