package proxy

import (
	"bytes"
	"fmt"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// Replies on the loop's shared upstream connections are matched to their
// requests by place: memcached answers a connection's requests in order.
// Every reply is checked against the request in its place before anyone is
// answered from it, and one that does not fit (a line outside the
// request's family, a VALUE block for a key it did not ask, memcached's
// out-of-memory error, after which it may have dropped replies owed) puts
// the connection out of step: it is closed there, every request still
// queued on it fails, and nothing read after the mismatch reaches a client.

// cmdReplies is the family of replies to each command of one key the loop
// sends as it is.
var cmdReplies = [wire.NumCommands]wire.Reply{
	wire.CmdSet: wire.ReplyStorage, wire.CmdAdd: wire.ReplyStorage, wire.CmdReplace: wire.ReplyStorage,
	wire.CmdAppend: wire.ReplyStorage, wire.CmdPrepend: wire.ReplyStorage, wire.CmdCas: wire.ReplyStorage,
	wire.CmdDelete: wire.ReplyDelete, wire.CmdTouch: wire.ReplyTouch, wire.CmdIncr: wire.ReplyMetaArith, wire.CmdDecr: wire.ReplyMetaArith,
	wire.CmdMetaSet: wire.ReplyMetaSet, wire.CmdMetaDelete: wire.ReplyMetaDelete, wire.CmdMetaGet: wire.ReplyMetaGet, wire.CmdMetaArithmetic: wire.ReplyMetaArith,
	wire.CmdMetaDebug: wire.ReplyMetaDebug,
}

// checkReply checks the whole reply of r, the first request queued, whose
// VALUE lines are vals. It returns the reply to answer r with (an incr's
// in its classic form), the error r and the requests joined to its line
// are answered with when memcached refused the retrieval with an error
// line of its own, and a non-nil bad when the reply puts the connection
// out of step.
func (u *loopUpstream) checkReply(r *loopReq, reply []byte, vals []upstream.ValueAt) (_ []byte, err error, bad *upstream.OutOfStepError) {
	switch {
	case r.store && r.expect == wire.ReplyMetaArith && r.slot.id == wire.CmdMetaArithmetic:
		// A client's ma, tagged as an incr is, answered in its meta form.
		if !r.expect.Fits(reply) || !wire.MetaTagged(reply, r.slot.tag) {
			return nil, nil, upstream.Unfitting(reply)
		}
	case r.store && r.expect == wire.ReplyMetaArith:
		classic, ok := wire.ArithReply(reply, r.slot.tag)
		if !ok {
			return nil, nil, upstream.Unfitting(reply)
		}
		return classic, nil, nil
	case r.store:
		if !r.expect.Fits(reply) {
			return nil, nil, upstream.Unfitting(reply)
		}
	case r.meta:
		// upstream.ReplyScan checked each line.
	case !bytes.HasSuffix(reply, wire.LineEnd):
		// A retrieval answered by one line other than END: memcached's
		// own error, whose keys are misses, or a reply out of step.
		if !wire.IsError(reply) || wire.OutOfStep(reply) {
			return nil, nil, upstream.Unfitting(reply)
		}
		return reply, fmt.Errorf("get: memcached replied: %q", reply), nil
	case !valuesFit(u.q.all()[:1+r.joined], reply, vals):
		return nil, nil, upstream.OutOfStep(upstream.ReasonUnaskedKey, reply[vals[0].At:])
	}
	return reply, nil, nil
}

// valuesFit reports whether the VALUE blocks of the reply to one get line
// answer keys that the requests sharing the line, group, asked, in the
// order they asked them: memcached answers the keys of a line in order
// and skips misses. It matches as loopSlot.match does.
func valuesFit(group []*loopReq, reply []byte, vals []upstream.ValueAt) bool {
	n := 0
	for _, r := range group {
		for _, i := range r.asked {
			if n == len(vals) {
				return true
			}
			if bytes.Equal(r.slot.upKey(i), vals[n].KeyIn(reply)) {
				n++
			}
		}
	}
	return n == len(vals)
}

// outOfStep closes the connection, found out of step at bad, and fails
// every request queued on it.
func (u *loopUpstream) outOfStep(bad *upstream.OutOfStepError) {
	u.srv.OutOfStep(bad)
	u.abort(bad)
}
