package proxy

import (
	"time"

	"mcsidecar/keyspace"
	"mcsidecar/proxy/internal/wire"
)

// expiresAtOnce reports whether memcached expires an item given exptime
// at once: a negative one, or a Unix time (past 30 days) not in the future.
func expiresAtOnce(exptime int32) bool {
	return exptime < 0 || exptime > wire.MaxRelativeTTL && int64(exptime) <= time.Now().Unix()
}

// refuseKeys refuses a whole retrieval, as memcached does, for a key it
// names that is not taken (memcached's 250 bytes, or with key settings
// --key-max-client-length and the bytes allowed): the refusal is counted
// by r, inspect's reason for the first such key, and answered
// CLIENT_ERROR.
func (c *conn) refuseKeys(id int, r keyspace.Reason) {
	c.countRefused(r)
	c.clientError(id, wire.LineBadFormat)
}

// seenScanMax is the most keys a retrieval looks for repeats of by
// scanning the keys grouped so far; a longer one keeps a map, which costs
// a hash and an insertion per key but does not grow with the keys.
const seenScanMax = 16
