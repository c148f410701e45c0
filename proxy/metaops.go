package proxy

import (
	"bytes"
	"strconv"
	"time"
)

// The meta commands go upstream as meta commands under the upstream key,
// asking memcached only for what the proxy needs; the client's own flags
// that only shape the reply (b, O, q, k) stay here. The reply is then
// written as memcached would have written it to the client: its return
// flags in the client's order, the client's key and opaque in place, the
// value, size and flags of an enveloped item as the client stored them.

// Meta reply codes, the two letters a reply line starts with.
var (
	metaCodeValue    = []byte("VA")
	metaCodeStored   = []byte("HD")
	metaCodeMiss     = []byte("EN")
	metaCodeExists   = []byte("EX")
	metaCodeNotFound = []byte("NF")
	metaCodeNotStore = []byte("NS")
)

// metaReply is an upstream meta reply line, split: its code, and the
// token of each return flag by letter.
type metaReply struct {
	code [2]byte
	has  uint64
	tok  [58][]byte // by letter, from 'A'
}

// parseMetaReply splits line ("XX[ <size>][ <flag>…]\r\n"); ok is false
// for a line that is no meta reply (an error line, for one). The tokens
// are sub-slices of line.
func (r *metaReply) parse(line []byte) bool {
	r.has = 0
	if len(line) < 4 || line[2] != ' ' && line[2] != '\r' || !bytes.HasSuffix(line, crlf) {
		return false
	}
	r.code = [2]byte{line[0], line[1]}
	if r.code[0] < 'A' || r.code[0] > 'Z' || r.code[1] < 'A' || r.code[1] > 'Z' {
		return false
	}
	rest := line[2 : len(line)-2]
	if r.code == [2]byte{'V', 'A'} {
		// The size: the data block is already in the call's arena.
		rest = bytes.TrimPrefix(rest, []byte{' '})
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			rest = rest[i:]
		} else {
			rest = nil
		}
	}
	for len(rest) > 0 {
		rest = rest[1:] // the space
		word := rest
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			word, rest = rest[:i], rest[i:]
		} else {
			rest = nil
		}
		if len(word) == 0 || word[0] < 'A' || word[0] > 'z' {
			continue
		}
		r.has |= metaFlagBit(word[0])
		r.tok[word[0]-'A'] = word[1:]
	}
	return true
}

// flag returns the token of return flag b, and whether it was there.
func (r *metaReply) flag(b byte) ([]byte, bool) {
	if r.has&metaFlagBit(b) == 0 {
		return nil, false
	}
	return r.tok[b-'A'], true
}

// readMeta copies the words of a meta command line into the connection's
// own buffer, so that they outlive the read buffer (a data block read may
// move it), and parses them into c.mst.req.
func (c *conn) readMeta(w [][]byte) *metaReq {
	if c.mst == nil {
		c.mst = new(metaState)
	}
	n := 0
	for _, x := range w {
		n += len(x)
	}
	if cap(c.mst.line) < n {
		c.mst.line = make([]byte, 0, n)
	}
	buf := c.mst.line[:0]
	words := c.mst.words[:0]
	for _, x := range w {
		start := len(buf)
		buf = append(buf, x...)
		words = append(words, buf[start:len(buf):len(buf)])
	}
	c.mst.line, c.mst.words = buf, words
	parseMeta(&c.mst.req, words, c.p.keys == nil)
	return &c.mst.req
}

// metaKey applies the proxy's key rules to a meta request's key (decoded
// when it came in base64) and returns the upstream key. A refused key is
// answered. holdable is false for a key no server can hold as it is (only
// without key settings: control bytes), unless it goes upstream in base64.
func (c *conn) metaKey(id int, m *metaReq) (k string, bound, holdable, ok bool) {
	if !c.validKey(m.key) {
		c.clientError(id, replyBadFormat)
		return "", false, false, false
	}
	up, bound, holdable := c.upstreamKey(m.key)
	m.setWire(up)
	return string(up), bound, holdable || m.bin, true
}

// appendMetaHead appends "<verb> <key>", the key in base64 with the b flag
// when the client sent it so: memcached then marks the item's key binary,
// as it would have for the client.
func appendMetaHead(dst []byte, verb string, k string, bin bool) []byte {
	dst = append(dst, verb...)
	if !bin {
		return append(dst, k...)
	}
	dst = appendBase64(dst, []byte(k))
	return append(dst, " b"...)
}

// appendMetaFlag appends " <letter><n>".
func appendMetaFlag(dst []byte, letter byte, n int64) []byte {
	dst = append(dst, ' ', letter)
	return strconv.AppendInt(dst, n, 10)
}

// appendMetaKey appends the k return flag: the key, or when it is binary
// its base64 and the b flag.
func appendMetaKey(dst, key []byte, bin bool) []byte {
	dst = append(dst, " k"...)
	if !bin {
		return append(dst, key...)
	}
	dst = appendBase64(dst, key)
	return append(dst, " b"...)
}

// appendMetaNoItem appends the flags memcached returns when there is no
// item to describe (EN, NF, NS, EX): the opaque and the key.
func appendMetaNoItem(dst []byte, m *metaReq) []byte {
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 'O':
			dst = append(dst, ' ')
			dst = append(dst, f...)
		case 'k':
			dst = appendMetaKey(dst, m.key, m.bin)
		}
	}
	return append(dst, crlf...)
}

// metaNoop answers mn.
func (c *conn) metaNoop([][]byte) error {
	c.p.stats.record(cmdMetaNoop, outcomeOK)
	c.wr.Write(replyMetaNoop)
	return nil
}

// metaMiss answers a meta get that found nothing: EN, unless quiet.
func (c *conn) metaMiss(m *metaReq) {
	c.p.stats.record(cmdMetaGet, outcomeMiss)
	c.writeMetaMiss(m)
}

// writeMetaMiss writes EN, unless quiet.
func (c *conn) writeMetaMiss(m *metaReq) {
	if m.quiet {
		return
	}
	c.mst.out = appendMetaNoItem(append(c.mst.out[:0], metaCodeMiss...), m)
	c.wr.Write(c.mst.out)
}

// metaRead sends c.req, a meta read of key k, to k's server in the local
// zone and, while the answer is a miss or a failure, in the other zones in
// order. It returns the answer that ends the search (a hit, or the local
// zone's answer when no zone had the key), its call (a hit's value is in
// its arena), server and zone.
func (c *conn) metaRead(k string) (line []byte, call *getCall, srv *server, from int, err error) {
	if c.zs == nil {
		srv = c.up.servers[c.serverFor(k)]
		line, err = c.send(srv, c.req, nil)
		return line, c.cmd, srv, 0, err
	}
	rehash := c.p.cfg.EjectRehash
	for z := range c.zs {
		zc := &c.zs[z]
		s := zc.up.servers[zc.up.pick(k, rehash)]
		l, e := sendOn(zc.cmd, s, c.req, nil)
		if z == 0 || err != nil && e == nil {
			line, call, srv, from, err = l, zc.cmd, s, z, e
		}
		if e == nil && !bytes.HasPrefix(l, metaCodeMiss) {
			return l, zc.cmd, s, z, nil
		}
	}
	return line, call, srv, from, err
}

// metaFill stores a hit that another zone answered into the local zone,
// as fillLocal does for get: with an add, so a value the local zone got
// meanwhile stays, with the bytes and flags memcached holds (envelope
// included) and the item's remaining time to live, or a touch's new one.
// The client's reply is written first.
func (c *conn) metaFill(k string, m *metaReq, r *metaReply, stored []byte, storedFlags uint32) {
	var exptime int64
	switch tok, _ := r.flag('t'); {
	case m.hasTTL:
		exptime = int64(m.ttl)
	case string(tok) == "-1":
	default:
		ttl, ok := parseDecimal(tok, 1<<31-1)
		if !ok || ttl == 0 {
			return // gone in under a second: not worth it
		}
		exptime = exptimeOf(int32(ttl))
	}
	c.flush()
	req := append(c.alignReq[:0], "ms "...)
	if m.wireBin {
		req = appendBase64(req, []byte(k))
	} else {
		req = append(req, k...)
	}
	req = append(req, ' ')
	req = strconv.AppendInt(req, int64(len(stored)), 10)
	if m.wireBin {
		req = append(req, " b"...)
	}
	req = appendMetaFlag(req, 'F', int64(storedFlags))
	req = appendMetaFlag(req, 'T', exptime)
	c.alignReq = append(req, " ME\r\n"...)
	zc := &c.zs[0]
	line, err := sendOn(zc.cmd, zc.up.servers[zc.up.pick(k, c.p.cfg.EjectRehash)], c.alignReq, stored)
	switch {
	case err != nil:
		c.p.fills[fillFailed].Add(1)
	case bytes.HasPrefix(line, metaCodeStored):
		c.p.fills[fillStored].Add(1)
	default:
		c.p.fills[fillNotStored].Add(1)
	}
}

// metaGet answers mg. It asks upstream for the value and flags whenever
// the codec is on, since an envelope must be opened (and verified) to
// answer anything about the item, and for the key when the client wants
// it back, to learn whether memcached holds it as binary.
func (c *conn) metaGet(w [][]byte) error {
	m := c.readMeta(w)
	if m.err != nil {
		return c.clientError(cmdMetaGet, m.err)
	}
	k, bound, holdable, ok := c.metaKey(cmdMetaGet, m)
	if !ok {
		return nil
	}
	if !holdable {
		c.metaMiss(m)
		return nil
	}
	codec := c.p.codec != nil
	// A hit from another zone is filled into the local one: that needs
	// its bytes, flags and time to live.
	filling := c.zs != nil && c.p.cfg.ZoneFill
	if m.hasTTL {
		c.forget(k) // a touch: the local tier's entry would outlive it
		defer c.forget(k)
	}
	// With zones, N creates the item only once no zone has it: the
	// zones are asked without it first, as a write is never decided by
	// a copy missing in one zone.
	vivifyLast := c.zs != nil && m.hasVivify
	c.req = c.appendMetaGet(c.req[:0], k, m, codec, filling, !vivifyLast)
	line, call, srv, from, err := c.metaRead(k)
	if vivifyLast && err == nil && bytes.HasPrefix(line, metaCodeMiss) {
		c.req = c.appendMetaGet(c.req[:0], k, m, codec, filling, true)
		zc := &c.zs[0]
		srv = zc.up.servers[zc.up.pick(k, c.p.cfg.EjectRehash)]
		line, err = sendOn(zc.cmd, srv, c.req, nil)
		call, from = zc.cmd, 0
	}
	if err != nil {
		if c.p.cfg.RetrievalFailure == failureError {
			return c.upstreamError(cmdMetaGet, srv, err)
		}
		// A miss for the client, an upstream error in the counters.
		srv.dropIdle(err)
		c.metaCountKey(m, false)
		c.p.stats.record(cmdMetaGet, outcomeUpstreamError)
		c.writeMetaMiss(m)
		return nil
	}
	r := &c.mst.rep
	c.mst.up = append(c.mst.up[:0], line...)
	if !r.parse(c.mst.up) || r.code != [2]byte{'V', 'A'} && r.code != [2]byte{'H', 'D'} {
		if bytes.HasPrefix(line, metaCodeMiss) {
			c.metaCountKey(m, false)
			c.metaMiss(m)
			return nil
		}
		// memcached's own error (refcount overflow, out of memory).
		c.answer(cmdMetaGet, line)
		return nil
	}
	value := call.arena
	var flags uint32
	if tok, ok := r.flag('f'); ok {
		flags, _ = parseUint32(tok)
	}
	stored, storedFlags := value, flags
	if codec {
		enveloped := c.p.codec.IsEnveloped(flags)
		switch {
		case enveloped:
			c.keyBuf = append(c.keyBuf[:0], m.key...)
			value, flags, ok = c.open(srv, c.keyBuf, k, bound, flags, value)
			if !ok {
				c.metaCountKey(m, false)
				c.metaMiss(m)
				return nil
			}
		case bound && (len(value) > 0 || flags != 0):
			// Under a rewritten key, a plain item is some client's own
			// value at an equal key: a miss. An empty one with no flags
			// is the stub N created, and holds nothing of anyone's.
			c.p.stats.keyUnbound.Add(1)
			c.metaCountKey(m, false)
			c.metaMiss(m)
			return nil
		}
	}
	c.metaCountKey(m, true)
	c.p.stats.record(cmdMetaGet, outcomeHit)
	out := c.mst.out[:0]
	if m.value {
		out = append(out, metaValue...)
		out = strconv.AppendInt(out, int64(len(value)), 10)
	} else {
		out = append(out, metaCodeStored...)
	}
	for _, f := range m.flags[:m.nflags] {
		switch l := f[0]; l {
		case 's':
			if codec {
				out = appendMetaFlag(out, 's', int64(len(value)))
			} else if tok, ok := r.flag('s'); ok {
				out = append(append(out, ' ', 's'), tok...)
			}
		case 'f':
			out = appendMetaFlag(out, 'f', int64(flags))
		case 't', 'c', 'l', 'h':
			if tok, ok := r.flag(l); ok {
				out = append(append(out, ' ', l), tok...)
			}
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			_, bin := r.flag('b')
			out = appendMetaKey(out, m.key, bin || m.bin && !m.wireBin)
		}
	}
	// memcached ends with Z (a win was sent), X (stale), W (won).
	for i := range len(metaEndFlags) {
		if _, ok := r.flag(metaEndFlags[i]); ok {
			out = append(out, ' ', metaEndFlags[i])
		}
	}
	out = append(out, crlf...)
	c.mst.out = out
	c.wr.Write(out)
	if m.value {
		c.wr.Write(value)
		c.wr.Write(crlf)
	}
	if from > 0 && filling {
		c.metaFill(k, m, r, stored, storedFlags)
	}
	return nil
}

// appendMetaGet appends the mg that asks upstream for what the client's
// mg needs: its flags but b, O, q, k (and N unless vivify), in its order,
// the value and flags when an envelope may have to be opened (codec) or
// the hit filled into the local zone, and the TTL for that fill.
func (c *conn) appendMetaGet(dst []byte, k string, m *metaReq, codec, filling, vivify bool) []byte {
	dst = appendMetaHead(dst, "mg ", k, m.wireBin)
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 's', 't', 'c', 'f', 'l', 'h', 'v', 'u', 'k':
			dst = append(dst, ' ', f[0])
		case 'T':
			dst = appendMetaFlag(dst, 'T', int64(m.ttl))
		case 'N':
			if vivify {
				dst = appendMetaFlag(dst, 'N', int64(m.vivify))
			}
		case 'R':
			dst = appendMetaFlag(dst, 'R', int64(m.recache))
		}
	}
	if (codec || filling) && !m.has('v') {
		dst = append(dst, " v"...)
	}
	if (codec || filling) && !m.has('f') {
		dst = append(dst, " f"...)
	}
	if filling && !m.has('t') {
		dst = append(dst, " t"...)
	}
	return append(dst, crlf...)
}

// metaEndFlags are the flags memcached appends to an mg hit, in its order.
const metaEndFlags = "ZXW"

// metaCountKey counts an mg's key as a retrieval's, hit or miss, for
// the proxy and for the key's tenant.
func (c *conn) metaCountKey(m *metaReq, hit bool) {
	c.p.stats.recordKey(m.hasTTL, hit)
	if t := c.tenantOf(m.key); t != nil {
		t.requests.Add(1)
		if hit {
			t.hits.Add(1)
		}
	}
}

// metaSet answers ms. As store does for the classic commands, the data
// block of a refused request is always consumed when its length was read.
func (c *conn) metaSet(w [][]byte) error {
	st := c.p.stats
	m := c.readMeta(w)
	keyOK := m.err != nil || c.validKey(m.key)
	if m.err == nil && keyOK && c.awaitBlock(m.vlen+2) {
		return errNeedMore
	}
	st.cmdSet.Add(1)
	if m.err != nil || !keyOK {
		reply := m.err
		if reply == nil {
			reply = replyBadFormat
		}
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(reply)
		if m.vlenOK {
			return c.rd.discard(m.vlen + 2)
		}
		return nil
	}
	up, bound, holdable := c.upstreamKey(m.key)
	m.setWire(up)
	k := string(up)
	if !holdable && !m.bin {
		// As for set: no server can hold such a key as it is.
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(replyBadFormat)
		return c.rd.discard(m.vlen + 2)
	}
	tenant := c.tenantOf(m.key)
	if tenant != nil {
		tenant.requests.Add(1)
	}
	join := m.mode == 'A' || m.mode == 'P'
	flags := m.clientFlags
	if join {
		flags = 0 // memcached keeps the item's flags
	}
	enveloped := bound || c.envelopes(m.key, flags)
	limit := int(c.p.cfg.MaxItemSize)
	if enveloped {
		limit = c.p.cfg.maxValueSize()
	}
	if m.vlen > limit {
		return c.metaTooLarge(k, m, m.vlen+2)
	}
	data, err := c.rd.data(m.vlen + 2)
	if err != nil {
		return err
	}
	if !bytes.HasSuffix(data, crlf) {
		st.record(cmdMetaSet, outcomeClientError)
		c.wr.Write(replyBadChunk)
		return nil
	}
	value := data[:m.vlen]
	if enveloped && join {
		if !forwardable(up) {
			return c.metaSetAnswer(m, metaCodeNotStore, nil)
		}
		c.keyBuf = append(c.keyBuf[:0], m.key...)
		return c.modifyInZones(k, func(srv *server) error {
			return c.metaJoinEnveloped(m, srv, k, bound, value)
		})
	}
	if enveloped {
		c.keyBuf = append(c.keyBuf[:0], m.key...)
		value, flags = c.encode(c.keyBuf, bound, m.clientFlags, value)
		if len(value) > int(c.p.cfg.MaxItemSize) {
			return c.metaTooLarge(k, m, 0)
		}
	}
	c.req = c.appendMetaStore(c.req[:0], k, m, flags, len(value), m.has('c'))
	var line []byte
	var srv *server
	z := 0
	// As for the classic commands: add goes to every zone and stores
	// only where no zone holds the key; a write that takes only where
	// the item is as expected (replace, cas, append, prepend) goes zone
	// after zone until one takes it; a set goes to every zone.
	deciding := false
	switch {
	case m.mode == 'E':
		line, srv, err = c.sendAdd(k, c.req, value)
	case m.hasCAS || m.mode == 'R' || join:
		deciding = true
		line, z, srv, err = c.sendDeciding(k, c.req, value)
	default:
		line, srv, err = c.sendEvery(k, c.req, value)
	}
	if err != nil {
		return c.upstreamError(cmdMetaSet, srv, err)
	}
	r := &c.mst.rep
	c.mst.up = append(c.mst.up[:0], line...)
	if !r.parse(c.mst.up) {
		c.answer(cmdMetaSet, line)
		return nil
	}
	cas, _ := r.flag('c')
	if r.code == [2]byte{'H', 'D'} {
		if enveloped {
			c.countStored(m.vlen, len(value))
		}
		if tenant != nil {
			tenant.written.Add(uint64(len(value)))
		}
		switch {
		case join:
			c.metaAlignDelete(z, k, m.wireBin)
		case deciding && c.zs != nil:
			// The other zones get a set of the value stored.
			mode, hasCAS, stale := m.mode, m.hasCAS, m.stale
			m.mode, m.hasCAS, m.stale = 0, false, false
			c.alignReq = c.appendMetaStore(c.alignReq[:0], k, m, flags, len(value), false)
			m.mode, m.hasCAS, m.stale = mode, hasCAS, stale
			c.alignZones(z, k, c.alignReq, value)
		}
	}
	return c.metaSetAnswer(m, r.code[:], cas)
}

// appendMetaStore appends the ms line that stores a value of size bytes
// under k with the item flags given and the client's TTL, CAS, mode and
// invalidation; withCAS asks for the new CAS value back.
func (c *conn) appendMetaStore(dst []byte, k string, m *metaReq, flags uint32, size int, withCAS bool) []byte {
	dst = append(dst, "ms "...)
	if m.wireBin {
		dst = appendBase64(dst, []byte(k))
	} else {
		dst = append(dst, k...)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(size), 10)
	if m.wireBin {
		dst = append(dst, " b"...)
	}
	dst = appendMetaFlag(dst, 'F', int64(flags))
	if m.hasTTL {
		dst = appendMetaFlag(dst, 'T', int64(m.ttl))
	}
	if m.hasCAS {
		dst = append(dst, " C"...)
		dst = strconv.AppendUint(dst, m.cas, 10)
	}
	if m.mode != 0 {
		dst = append(dst, ' ', 'M', m.mode)
	}
	if m.stale {
		dst = append(dst, " I"...)
	}
	if withCAS {
		dst = append(dst, " c"...)
	}
	return append(dst, crlf...)
}

// metaSetAnswer answers ms with code and the client's return flags in its
// order; cas is the c flag's value. quiet hides HD only.
func (c *conn) metaSetAnswer(m *metaReq, code, cas []byte) error {
	oc := outcomeStored
	switch {
	case bytes.Equal(code, metaCodeNotStore):
		oc = outcomeNotStored
	case bytes.Equal(code, metaCodeExists):
		oc = outcomeExists
	case bytes.Equal(code, metaCodeNotFound):
		oc = outcomeNotFound
	}
	c.p.stats.record(cmdMetaSet, oc)
	if oc == outcomeStored && m.quiet {
		return nil
	}
	if cas == nil {
		cas = metaZero
	}
	out := append(c.mst.out[:0], code...)
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			out = appendMetaKey(out, m.key, m.bin)
		case 'c':
			out = append(append(out, " c"...), cas...)
		}
	}
	c.mst.out = append(out, crlf...)
	c.wr.Write(c.mst.out)
	return nil
}

// metaZero is the CAS value memcached returns when nothing was stored.
var metaZero = []byte("0")

// metaTooLarge refuses a value over the size limits as memcached does,
// dropping the item it would have replaced, whatever the mode, and
// consumes the n bytes of the data block still unread.
func (c *conn) metaTooLarge(k string, m *metaReq, n int) error {
	c.p.stats.record(cmdMetaSet, outcomeClientError)
	c.wr.Write(replyTooLarge)
	c.req = append(appendMetaHead(c.req[:0], "md ", k, m.wireBin), crlf...)
	c.sendEvery(k, c.req, nil)
	if n == 0 {
		return nil
	}
	return c.rd.discard(n)
}

// metaAlignDelete drops k from every zone but z after a change in place
// there, as alignDelete does, in base64 when the key went so.
func (c *conn) metaAlignDelete(z int, k string, bin bool) {
	if c.zs == nil {
		return
	}
	c.alignReq = append(appendMetaHead(c.alignReq[:0], "md ", k, bin), crlf...)
	c.alignZones(z, k, c.alignReq, nil)
}

// metaJoinEnveloped answers ms in append or prepend mode on a key whose
// values are enveloped, as joinEnveloped does for append and prepend: a
// missing item is NS (or, asked quietly by modifyInZones, no answer), a
// CAS the item no longer has is EX. The client key is in c.keyBuf.
func (c *conn) metaJoinEnveloped(m *metaReq, srv *server, k string, bound bool, data []byte) error {
	id := cmdMetaSet
	c.changed = false
	for attempt := range rmwAttempts {
		backoff(attempt)
		old, it, found, err := c.readForUpdate(srv, k, c.keyBuf, bound)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		if !found && c.quietMiss {
			c.missed = true
			return nil
		}
		if !found {
			return c.metaSetAnswer(m, metaCodeNotStore, nil)
		}
		if m.hasCAS && it.cas != m.cas {
			return c.metaSetAnswer(m, metaCodeExists, nil)
		}
		if m.mode == 'A' {
			c.tmp = append(append(c.tmp[:0], old...), data...)
		} else {
			c.tmp = append(append(c.tmp[:0], data...), old...)
		}
		conflict, notStored, cas, err := c.writeBackCAS(srv, k, c.keyBuf, bound, it, c.tmp)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		if notStored {
			return c.metaSetAnswer(m, metaCodeNotStore, nil)
		}
		if !conflict {
			c.changed = true
			return c.metaSetAnswer(m, metaCodeStored, strconv.AppendUint(c.scratch[:0], cas, 10))
		}
	}
	c.p.stats.record(id, outcomeUpstreamError)
	c.wr.Write(replyContended)
	return nil
}

// metaDelete answers md. A plain delete or invalidation reaches every
// zone; one gated by a CAS value is decided by the first zone that
// answers, and the others drop their copy when it took.
func (c *conn) metaDelete(w [][]byte) error {
	m := c.readMeta(w)
	if m.err != nil {
		return c.clientError(cmdMetaDelete, m.err)
	}
	k, _, holdable, ok := c.metaKey(cmdMetaDelete, m)
	if !ok {
		return nil
	}
	if !holdable {
		return c.metaAnswer(cmdMetaDelete, m, metaCodeNotFound, nil, nil)
	}
	c.req = appendMetaHead(c.req[:0], "md ", k, m.wireBin)
	if m.hasCAS {
		c.req = append(c.req, " C"...)
		c.req = strconv.AppendUint(c.req, m.cas, 10)
	}
	if m.stale {
		c.req = append(c.req, " I"...)
	}
	if m.hasTTL {
		c.req = appendMetaFlag(c.req, 'T', int64(m.ttl))
	}
	c.req = append(c.req, crlf...)
	var line []byte
	var srv *server
	var err error
	z := 0
	if m.hasCAS {
		line, z, srv, err = c.sendDeciding(k, c.req, nil)
	} else {
		line, srv, err = c.sendEvery(k, c.req, nil)
	}
	if err != nil {
		return c.upstreamError(cmdMetaDelete, srv, err)
	}
	r := &c.mst.rep
	c.mst.up = append(c.mst.up[:0], line...)
	if !r.parse(c.mst.up) {
		c.answer(cmdMetaDelete, line)
		return nil
	}
	if m.hasCAS && r.code == [2]byte{'H', 'D'} {
		c.metaAlignDelete(z, k, m.wireBin)
	}
	return c.metaAnswer(cmdMetaDelete, m, r.code[:], r, nil)
}

// metaAnswer answers md or ma with code and the client's return flags in
// its order: c and t from memcached's reply r when there is an item (HD,
// VA), the opaque and key always. value is ma's number (VA). quiet hides
// the nominal reply (HD, and ma's VA).
func (c *conn) metaAnswer(id int, m *metaReq, code []byte, r *metaReply, value []byte) error {
	oc := outcomeOK
	switch {
	case bytes.Equal(code, metaCodeNotFound):
		oc = outcomeNotFound
	case bytes.Equal(code, metaCodeExists):
		oc = outcomeExists
	case bytes.Equal(code, metaCodeNotStore):
		oc = outcomeNotStored
	}
	c.p.stats.record(id, oc)
	if oc == outcomeOK && m.quiet {
		return nil
	}
	out := c.mst.out[:0]
	if oc != outcomeOK || r == nil {
		out = appendMetaNoItem(append(out, code...), m)
	} else {
		if value != nil {
			out = append(out, metaValue...)
			out = strconv.AppendInt(out, int64(len(value)), 10)
		} else {
			out = append(out, code...)
		}
		for _, f := range m.flags[:m.nflags] {
			switch l := f[0]; l {
			case 'c', 't':
				if id != cmdMetaArithmetic {
					continue
				}
				if tok, ok := r.flag(l); ok {
					out = append(append(out, ' ', l), tok...)
				}
			case 'O':
				out = append(append(out, ' '), f...)
			case 'k':
				out = appendMetaKey(out, m.key, m.bin)
			}
		}
		out = append(out, crlf...)
		if value != nil {
			out = append(append(out, value...), crlf...)
		}
	}
	c.mst.out = out
	c.wr.Write(out)
	return nil
}

// metaArithmetic answers ma. Like incr and decr it is decided by the first
// zone that answers, and the others drop their copy when it changed.
func (c *conn) metaArithmetic(w [][]byte) error {
	m := c.readMeta(w)
	if m.err != nil {
		return c.clientError(cmdMetaArithmetic, m.err)
	}
	k, bound, holdable, ok := c.metaKey(cmdMetaArithmetic, m)
	if !ok {
		return nil
	}
	if !holdable {
		return c.metaAnswer(cmdMetaArithmetic, m, metaCodeNotFound, nil, nil)
	}
	if bound || c.envelopes(m.key, 0) {
		if !forwardable([]byte(k)) {
			return c.metaAnswer(cmdMetaArithmetic, m, metaCodeNotFound, nil, nil)
		}
		c.keyBuf = append(c.keyBuf[:0], m.key...)
		return c.modifyInZones(k, func(srv *server) error {
			return c.metaArithmeticEnveloped(m, srv, k, bound)
		})
	}
	c.req = appendMetaHead(c.req[:0], "ma ", k, m.wireBin)
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 't', 'c', 'v':
			c.req = append(c.req, ' ', f[0])
		case 'T':
			c.req = appendMetaFlag(c.req, 'T', int64(m.ttl))
		case 'N':
			c.req = appendMetaFlag(c.req, 'N', int64(m.vivify))
		case 'J':
			c.req = append(c.req, " J"...)
			c.req = strconv.AppendUint(c.req, m.initial, 10)
		case 'D':
			c.req = append(c.req, " D"...)
			c.req = strconv.AppendUint(c.req, m.delta, 10)
		case 'C':
			c.req = append(c.req, " C"...)
			c.req = strconv.AppendUint(c.req, m.cas, 10)
		case 'M':
			c.req = append(c.req, ' ', 'M', m.mode)
		}
	}
	c.req = append(c.req, crlf...)
	line, z, srv, err := c.sendDeciding(k, c.req, nil)
	if err != nil {
		return c.upstreamError(cmdMetaArithmetic, srv, err)
	}
	r := &c.mst.rep
	c.mst.up = append(c.mst.up[:0], line...)
	if !r.parse(c.mst.up) {
		c.answer(cmdMetaArithmetic, line)
		return nil
	}
	var value []byte
	if r.code == [2]byte{'V', 'A'} {
		value = c.cmdCall(z).arena
	}
	if r.code == [2]byte{'V', 'A'} || r.code == [2]byte{'H', 'D'} {
		c.metaAlignDelete(z, k, m.wireBin)
		return c.metaAnswer(cmdMetaArithmetic, m, metaCodeStored, r, value)
	}
	return c.metaAnswer(cmdMetaArithmetic, m, r.code[:], r, nil)
}

// cmdCall returns the command call of zone z, which holds the data block
// of the last reply there.
func (c *conn) cmdCall(z int) *getCall {
	if c.zs == nil {
		return c.cmd
	}
	return c.zs[z].cmd
}

// metaArithmeticEnveloped answers ma on a key whose values are enveloped,
// with memcached's arithmetic (see arithmeticEnveloped): a missing item is
// NF, or with N created from J (default 0) by an add; a CAS the item no
// longer has is EX. The client key is in c.keyBuf.
func (c *conn) metaArithmeticEnveloped(m *metaReq, srv *server, k string, bound bool) error {
	id := cmdMetaArithmetic
	c.changed = false
	for attempt := range rmwAttempts {
		backoff(attempt)
		old, it, found, err := c.readForUpdate(srv, k, c.keyBuf, bound)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		var n, cas uint64
		var oldTTL int32
		if !found && c.quietMiss {
			// Another zone may have it: only the last one asked
			// answers NF or creates the item.
			c.missed = true
			return nil
		}
		if !found {
			if !m.hasVivify {
				return c.metaAnswer(id, m, metaCodeNotFound, nil, nil)
			}
			n, oldTTL = m.initial, -1
			c.tmp = strconv.AppendUint(c.tmp[:0], n, 10)
			ttl := metaTTL(m, oldTTL, true)
			stored, storedFlags := c.encode(c.keyBuf, bound, 0, c.tmp)
			c.alignReq = append(append(c.alignReq[:0], "ms "...), k...)
			c.alignReq = append(c.alignReq, ' ')
			c.alignReq = strconv.AppendInt(c.alignReq, int64(len(stored)), 10)
			c.alignReq = appendMetaFlag(c.alignReq, 'F', int64(storedFlags))
			c.alignReq = appendMetaFlag(c.alignReq, 'T', exptimeOf(ttl))
			c.alignReq = append(c.alignReq, " ME c\r\n"...)
			line, err := c.send(srv, c.alignReq, stored)
			if err != nil {
				return c.upstreamError(id, srv, err)
			}
			if !bytes.HasPrefix(line, storedWithCAS) {
				continue // another client created it first
			}
			cas, _ = parseUint64(bytes.TrimSuffix(line[len(storedWithCAS):], crlf))
			c.changed = true
			return c.metaArithmeticAnswer(m, n, cas, oldTTL, true)
		}
		if m.hasCAS && it.cas != m.cas {
			return c.metaAnswer(id, m, metaCodeExists, nil, nil)
		}
		var ok bool
		if n, ok = parseCounter(old); !ok {
			return c.clientError(id, replyNonNumeric)
		}
		switch {
		case m.mode != 'D' && m.mode != '-':
			n += m.delta
		case m.delta > n:
			n = 0
		default:
			n -= m.delta
		}
		c.tmp = strconv.AppendUint(c.tmp[:0], n, 10)
		for len(c.tmp) < len(old) {
			c.tmp = append(c.tmp, ' ')
		}
		oldTTL = it.ttl
		it.ttl = metaTTL(m, oldTTL, false)
		conflict, notStored, newCAS, err := c.writeBackCAS(srv, k, c.keyBuf, bound, it, c.tmp)
		if err != nil {
			return c.upstreamError(id, srv, err)
		}
		if !conflict && !notStored {
			c.changed = true
			return c.metaArithmeticAnswer(m, n, newCAS, oldTTL, false)
		}
	}
	c.p.stats.record(id, outcomeUpstreamError)
	c.wr.Write(replyContended)
	return nil
}

// metaTTL walks ma's flags in order as memcached does: T sets the item's
// time to live, and N does when the item was just created. It returns the
// time to live the item ends with (seconds, -1: never).
func metaTTL(m *metaReq, ttl int32, created bool) int32 {
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 'T':
			ttl = ttlOf(m.ttl)
		case 'N':
			if created {
				ttl = ttlOf(m.vivify)
			}
		}
	}
	return ttl
}

// ttlOf is the time to live an exptime gives, in seconds (-1: never; 0:
// already expired), as memcached reads exptimes.
func ttlOf(exptime int32) int32 {
	switch {
	case exptime == 0:
		return -1
	case exptime < 0:
		return 0
	case exptime > maxRelativeTTL:
		return max(0, exptime-int32(time.Now().Unix()))
	}
	return exptime
}

// metaArithmeticAnswer answers an enveloped ma that took: HD or VA with the
// number, c the new CAS value, t the time to live as it stood where the
// client put t.
func (c *conn) metaArithmeticAnswer(m *metaReq, n, cas uint64, ttl int32, created bool) error {
	c.p.stats.record(cmdMetaArithmetic, outcomeOK)
	if m.quiet {
		return nil
	}
	out := c.mst.out[:0]
	c.scratch = strconv.AppendUint(c.scratch[:0], n, 10)
	if m.value {
		out = append(out, metaValue...)
		out = strconv.AppendInt(out, int64(len(c.scratch)), 10)
	} else {
		out = append(out, metaCodeStored...)
	}
	for _, f := range m.flags[:m.nflags] {
		switch f[0] {
		case 'T':
			ttl = ttlOf(m.ttl)
		case 'N':
			if created {
				ttl = ttlOf(m.vivify)
			}
		case 'c':
			out = append(out, " c"...)
			out = strconv.AppendUint(out, cas, 10)
		case 't':
			out = appendMetaFlag(out, 't', int64(ttl))
		case 'O':
			out = append(append(out, ' '), f...)
		case 'k':
			out = appendMetaKey(out, m.key, m.bin)
		}
	}
	out = append(out, crlf...)
	if m.value {
		out = append(append(out, c.scratch...), crlf...)
	}
	c.mst.out = out
	c.wr.Write(out)
	return nil
}

// metaDebug answers me. It is forwarded: memcached describes the item it
// holds under the upstream key (its size is what is stored, envelope
// included), and the client's key is put back in the reply, in base64
// when memcached holds the key as binary. A key no server can hold is a
// miss, EN, as memcached answers for a missing key.
func (c *conn) metaDebug(w [][]byte) error {
	m := c.readMeta(w)
	if m.err != nil {
		return c.clientError(cmdMetaDebug, m.err)
	}
	k, _, holdable, ok := c.metaKey(cmdMetaDebug, m)
	if !ok {
		return nil
	}
	if !holdable {
		c.p.stats.record(cmdMetaDebug, outcomeMiss)
		c.wr.Write(metaMiss)
		return nil
	}
	c.req = append(appendMetaHead(c.req[:0], "me ", k, m.wireBin), crlf...)
	line, _, srv, _, err := c.metaRead(k)
	if err != nil {
		return c.upstreamError(cmdMetaDebug, srv, err)
	}
	rest, ok := bytes.CutPrefix(line, []byte("ME "))
	if !ok {
		oc := outcomeMiss
		if !bytes.Equal(line, metaMiss) {
			oc = replyOutcome(line)
		}
		c.p.stats.record(cmdMetaDebug, oc)
		c.wr.Write(line)
		return nil
	}
	c.p.stats.record(cmdMetaDebug, outcomeHit)
	sent, info, _ := bytes.Cut(rest, []byte{' '})
	out := append(c.mst.out[:0], "ME "...)
	if string(sent) != k {
		out = appendBase64(out, m.key) // memcached holds the key as binary
	} else {
		out = append(out, m.key...)
	}
	out = append(append(out, ' '), info...)
	c.mst.out = out
	c.wr.Write(out)
	return nil
}
