package proxy

import (
	"time"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
)

// expiresAtOnce reports whether memcached expires an item given exptime
// at once: a negative one, or a Unix time (past 30 days) not in the future.
func expiresAtOnce(exptime int32) bool {
	return exptime < 0 || exptime > wire.MaxRelativeTTL && int64(exptime) <= time.Now().Unix()
}

// checkKeys refuses the whole request, as memcached does, when a key is
// longer than allowed (memcached's 250 bytes, or --key-max-client-length).
func (c *conn) checkKeys(id int, keys [][]byte) bool {
	for _, k := range keys {
		if !c.validKey(k) {
			c.p.stats.Record(id, stats.OutcomeClientError)
			c.reply(wire.LineBadFormat)
			return false
		}
	}
	return true
}

// seenScanMax is the most keys a retrieval looks for repeats of by
// scanning the keys grouped so far; a longer one keeps a map, which costs
// a hash and an insertion per key but does not grow with the keys.
const seenScanMax = 16
