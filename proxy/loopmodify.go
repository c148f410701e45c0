package proxy

import (
	"bytes"
	"fmt"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
	"mcsidecar/proxy/zones"
)

// A read-modify-write of an enveloped item on the loop: append, prepend,
// incr and decr, ms in mode A or P, and ma, on a key whose values are
// enveloped. memcached cannot change an envelope in place, so the item is
// read (mg), opened, changed by the command's op (see rmw), and written
// back only if it is unchanged (ms with C), each step a request that
// continues when memcached answers. A write that lost a race reads again,
// up to rmwAttempts times: the round trip of the next read spaces the
// tries. With zones, the zones whose server for the key is not ejected
// are tried in order until one holds the item, and once the item changed
// the others drop their copy.

// loopModify is the state of one read-modify-write.
type loopModify struct {
	op rmw
	// The client's key, and what its values are stored as.
	key            []byte
	bind, postings bool
	noreply        bool
	// zones are the zones to try, the one being tried at zi.
	zones   []int
	zi      int
	attempt int
	step    uint8
	// it is the item read, whose value the write back replaces; logical
	// and stored are the lengths of the new value, for the counters.
	it              upstream.MetaItem
	logical, stored int
	changed         bool
	// data is the client's data block (append, prepend, ms), which op
	// joins to the value.
	data []byte
}

// Steps of a read-modify-write: the request whose reply it waits for.
const (
	modifyRead = iota
	modifyWrite
	modifyCreate
)

// modify starts a read-modify-write by command id of key, sent upstream
// as up (resolved as rk), whose op is made by makeOp once the request's
// data is the slot's own (data, copied).
func (lc *loopClient) modify(id int, key []byte, rk resolvedKey, noreply bool, lm *loopMeta, data []byte, makeOp func(c *conn, data []byte) rmw) {
	c := lc.c
	p := c.p
	s := lc.ls.slot(lc, id)
	if lm != nil {
		s.takeMeta(lm)
	}
	s.kind, s.serial = wire.CmdAppend, true // zone after zone, and first (see heldBehind)
	mod := s.spareMod
	if mod == nil {
		mod = new(loopModify)
	}
	s.spareMod = nil
	*mod = loopModify{key: append(mod.key[:0], key...), data: append(mod.data[:0], data...), zones: mod.zones[:0],
		bind: rk.bound, postings: rk.postings, noreply: noreply}
	s.mod = mod
	mod.op = makeOp(c, mod.data)
	s.ups = append(s.ups[:0], rk.up...)
	lc.slots = append(lc.slots, s)
	c.lastCmd.Store(s.began.UnixNano())
	p.writingOf(rk.up)
	for z, zone := range p.zones {
		if !zone.Up.Load().Servers[zone.Up.Load().Pick(string(rk.up), p.cfg.EjectRehash)].Ejected() {
			mod.zones = append(mod.zones, z)
		}
	}
	if len(mod.zones) == 0 {
		mod.zones = append(mod.zones, 0)
	}
	s.pending = 1
	s.modifyRead()
}

// modifyRead reads the item in the zone being tried.
func (s *loopSlot) modifyRead() {
	mod := s.mod
	mod.step = modifyRead
	s.arena = append(append(append(s.arena[:0], "mg "...), s.ups...), " v f c t u\r\n"...)
	s.modifySend(wire.ReplyMetaGet)
}

// modifySend sends the request in the slot's arena to the key's server in
// the zone being tried.
func (s *loopSlot) modifySend(expect wire.Reply) { s.sendKept(s.mod.zones[s.mod.zi], expect) }

// modified takes the reply to the read-modify-write's request, or err.
func (s *loopSlot) modified(r *loopReq, reply []byte, err error) {
	mod := s.mod
	switch {
	case err != nil:
		s.modifyFail(r.srv, err)
	case mod.step == modifyRead:
		s.modifyReadDone(r, reply)
	case mod.step == modifyCreate:
		if !bytes.HasPrefix(reply, wire.LineStoredWithCAS) {
			s.modifyAgain() // another client created it first
			return
		}
		cas, _ := wire.ParseUint64(bytes.TrimSuffix(reply[len(wire.LineStoredWithCAS):], wire.CRLF))
		mod.changed = true
		s.modifyAnswer(func() { mod.op.created(cas) })
		s.modifyEnd()
	default:
		s.modifyWriteDone(r, reply)
	}
}

// modifyReadDone takes the item read, and writes it back changed, or
// answers.
func (s *loopSlot) modifyReadDone(r *loopReq, reply []byte) {
	c := s.client.c
	p := c.p
	mod := s.mod
	line := reply
	if i := bytes.IndexByte(reply, '\n'); i >= 0 {
		line = reply[:i+1]
	}
	found := false
	var old []byte
	switch {
	case bytes.Equal(line, wire.LineMetaMiss):
	case !bytes.HasPrefix(line, wire.LineMetaValue):
		s.modifyFail(r.srv, fmt.Errorf("mg: memcached replied: %q", line))
		return
	default:
		_, it, err := upstream.ParseMetaValue(line)
		if err != nil {
			s.modifyFail(r.srv, err)
			return
		}
		mod.it, old = it, reply[len(line):len(reply)-len(wire.CRLF)]
		switch {
		case !p.codec.IsEnveloped(it.Flags) && mod.bind:
			// Some client's own value at a key equal to this rewritten
			// one: not ours.
			p.stats.KeyUnbound.Add(1)
		case !p.codec.IsEnveloped(it.Flags):
			// A plain item under a key whose values are now enveloped.
			found = true
		default:
			var damaged bool
			old, mod.it.Flags, found, damaged = c.openValue(mod.key, mod.bind, it.Flags, old)
			if damaged {
				s.deleteCorrupt(s.zone, s.ups)
			}
		}
	}
	if !found {
		s.modifyMissing()
		return
	}
	var goOn bool
	s.modifyAnswer(func() { goOn = mod.op.change(old, &mod.it) })
	if !goOn {
		s.modifyEnd() // answered
		return
	}
	s.modifyWriteBack()
}

// modifyMissing goes on after the item was not found: in the next zone,
// or by creating it, or with op's answer.
func (s *loopSlot) modifyMissing() {
	c := s.client.c
	mod := s.mod
	if mod.zi+1 < len(mod.zones) {
		mod.zi++
		s.modifyRead()
		return
	}
	if mod.op.create != nil {
		// create only makes the value: it does not answer.
		if value, exptime, ok := mod.op.create(); ok {
			stored, storedFlags := c.encodeFor(mod.key, mod.bind, mod.postings, 0, value)
			s.arena = appendCreate(s.arena[:0], string(s.ups), len(stored), storedFlags, exptime)
			s.arena = append(append(s.arena, stored...), wire.CRLF...)
			mod.step = modifyCreate
			s.modifySend(wire.ReplyMetaSet)
			return
		}
	}
	var retry bool
	s.modifyAnswer(func() { retry = mod.op.missing() })
	if !retry {
		s.modifyEnd() // answered
		return
	}
	s.modifyAgain()
}

// modifyWriteBack writes the changed value (c.tmp) back if the item is
// still as it was read: an ms with the CAS value it was read with.
func (s *loopSlot) modifyWriteBack() {
	c := s.client.c
	mod := s.mod
	mod.logical = len(c.tmp)
	stored, storedFlags := c.encodeFor(mod.key, mod.bind, mod.postings, mod.it.Flags, c.tmp)
	if len(stored) > int(c.p.cfg.MaxItemSize) {
		s.modifyStored(true, 0)
		return
	}
	mod.stored = len(stored)
	it := mod.it
	it.Flags = storedFlags
	s.arena = upstream.AppendStoreIfUnchanged(s.arena[:0], string(s.ups), it, stored)
	mod.step = modifyWrite
	s.modifySend(wire.ReplyMetaSet)
}

// modifyWriteDone takes memcached's reply to the write back.
func (s *loopSlot) modifyWriteDone(r *loopReq, reply []byte) {
	c := s.client.c
	conflict, notStored, cas, err := upstream.StoreIfUnchangedReply(reply)
	switch {
	case err != nil:
		s.modifyFail(r.srv, err)
	case conflict:
		s.modifyAgain()
	default:
		if !notStored {
			c.countStored(s.mod.logical, s.mod.stored)
		}
		s.modifyStored(notStored, cas)
	}
}

// modifyStored answers a write back that was not refused for a conflict,
// or tries again when op says so.
func (s *loopSlot) modifyStored(notStored bool, cas uint64) {
	mod := s.mod
	var done bool
	s.modifyAnswer(func() { done = mod.op.stored(notStored, cas) })
	if done {
		mod.changed = !notStored
		s.modifyEnd()
		return
	}
	s.modifyAgain()
}

// modifyAgain reads the item again after a lost race, up to rmwAttempts
// tries, and then answers that the item is contended.
func (s *loopSlot) modifyAgain() {
	mod := s.mod
	if mod.attempt++; mod.attempt < rmwAttempts {
		s.modifyRead()
		return
	}
	c := s.client.c
	s.modifyAnswer(func() {
		c.p.stats.Record(s.id, stats.OutcomeUpstreamError)
		c.reply(wire.LineContended)
	})
	s.modifyEnd()
}

// modifyFail answers a request of the read-modify-write that failed, or
// whose reply was not what it asked for, as an upstream error is
// answered (upstreamReply).
func (s *loopSlot) modifyFail(srv *upstream.Server, err error) {
	c := s.client.c
	s.modifyAnswer(func() { c.upstreamError(s.id, srv, err) })
	s.modifyEnd()
}

// modifyAnswer runs answer, a step of the op that may answer the client,
// with the connection's replies going to the slot.
func (s *loopSlot) modifyAnswer(answer func()) {
	c := s.client.c
	if c.mst == nil {
		c.mst = new(metaState)
	}
	start := len(s.line)
	w := replyWriter{buf: s.line}
	c.wr, c.noreply = &w, s.mod.noreply
	answer()
	c.wr = nil
	s.line = w.buf
	if len(s.line) > start {
		s.out = append(s.out, s.line[start:])
	}
}

// modifyEnd ends the read-modify-write once answered: the other zones
// drop their copy of an item that changed, and the reply goes once they
// did (see alignZone).
func (s *loopSlot) modifyEnd() {
	mod := s.mod
	if mod.step == 0xff {
		return // answered already
	}
	mod.step = 0xff
	p := s.client.c.p
	if mod.changed && len(p.zones) > 1 && p.cfg.ZoneWrites != zones.WritesLocal {
		s.keys = appendKeyCommand(s.keys[:0], "delete ", string(s.ups), nil)
		s.alignAll(s.keys)
	}
	p.wroteOf(s.ups)
	s.release()
}
