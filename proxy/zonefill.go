package proxy

import (
	"mcsidecar/proxy/internal/wire"
)

// The end of a zone fill (see fillLocal, loopSlot.fill and metaFill):
// its result, and the delete of a fill that a write raced (see
// writeguard).

// unfill deletes upstream key k from the local zone again, on u, for a
// fill that a write raced. The delete is a write of its own, so that no
// read keeps what it drops; its reply ends it (see countDropped).
func (u *loopUpstream) unfill(k []byte) {
	r := u.dropReq(dropUnfill, 0, wire.ReplyDelete)
	r.key = append(r.key, k...)
	u.ls.l.p.writingOf(k)
	if u.pushDropped(nil, r) {
		u.out = append(append(append(u.out, "delete "...), k...), wire.CRLF...)
	}
}
