package proxy

import (
	"bytes"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// The end of a zone fill (see fillLocal, loopSlot.fill and metaFill):
// its result, and the delete of a fill that a write raced (see
// writeGuard).

// fillable reports whether owner o's key is to be filled into the local
// zone: another zone's hit, not gone in under a second, named first.
func (c *conn) fillable(o keyOwner) bool {
	if o.srv < 0 || o.zone == 0 || o.repeat {
		return false
	}
	call := c.call(o)
	return call.Err == nil && call.Items[o.pos].Hit && call.Items[o.pos].TTL != 0
}

// fillNote is a fill sent to the local zone: the owner of its key, and
// the local server it went to.
type fillNote struct{ owner, srv int32 }

// filled counts the fills that call carried to local server s, and
// deletes again those that a write raced after they were sent.
func (c *conn) filled(s int32, call *upstream.Call) {
	rest := call.Reply
	for _, n := range c.fillNotes {
		if n.srv != s {
			continue
		}
		result := fillFailed
		if call.Err == nil {
			var line []byte
			line, rest, _ = bytes.Cut(rest, []byte{'\n'})
			result = fillNotStored
			if bytes.Equal(line, replyStored[:len(replyStored)-1]) {
				result = fillStored
			}
		}
		o := c.owners[n.owner]
		key := c.call(o).Keys[o.pos]
		if mayHaveStored(result) && c.p.wroteSince(key, o.written) {
			c.alignReq = appendKeyCommand(c.alignReq[:0], "delete ", key, nil)
			c.unfill(key, c.alignReq)
			result = fillDropped
		}
		c.p.fills[result].Add(1)
	}
}

// mayHaveStored reports whether a fill with result may have stored its
// value: it did, or it failed after it may have. One that a write to its
// key raced, which may have reached memcached first on another
// connection, is then deleted again.
func mayHaveStored(result int) bool { return result == fillStored || result == fillFailed }

// unfill deletes, with req, upstream key k from the local zone again, for
// a fill that a write raced. The delete is a write of its own, so that no
// read keeps what it drops (see writeGuard).
func (c *conn) unfill(k string, req []byte) {
	c.writing(k)
	defer c.wrote(k)
	c.zs[0].send(k, c.p.cfg.EjectRehash, req, nil)
}

// unfill deletes upstream key k from the local zone again, on u, for a
// fill that a write raced. The delete is a write of its own, so that no
// read keeps what it drops; its reply ends it (see countDropped).
func (u *loopUpstream) unfill(k []byte) {
	r := u.dropReq(dropUnfill, 0, wire.ReplyDelete)
	r.key = append(r.key, k...)
	u.ls.l.p.writingOf(k)
	if u.pushDropped(nil, r) {
		u.out = append(append(append(u.out, "delete "...), k...), crlf...)
	}
}
