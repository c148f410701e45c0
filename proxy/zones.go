package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// Zones keep a sidecar's reads inside its availability zone. Each zone is
// a server set of its own, with its own discovery, selector and health; a
// key's server within a zone is chosen as without zones. The local zone
// comes first and the others follow in the order given, which is the
// order a read falls through them:
//
//   - A read asks the local zone; its misses, and keys whose local server
//     failed or is ejected, are asked of the next zone, in one request per
//     server, and so on. The first hit answers, with the flags and CAS of
//     the zone that had it. A hit from another zone is stored into the
//     local zone (--zone-fill) with an add and its remaining time to live,
//     so a newer local value is never overwritten.
//   - With --zone-writes=all a write reaches every zone and the local
//     zone's reply answers the client; when the local zone fails, the
//     first zone that answered does, so the sidecar keeps taking writes.
//     A zone may lack a copy another holds (dropped, not yet filled), so
//     no write is decided by a missing copy. set, delete, touch and
//     flush_all go to every zone at once. add goes to every zone too,
//     and stores only if no zone held the key. replace, cas, append,
//     prepend, incr and decr go zone after zone until one takes them;
//     then the others get a set of the value stored (replace, cas) or
//     drop their copy (the others, which change the value in place), to
//     be filled from the deciding zone. A copy can thus be missing in a
//     zone, never older than the deciding zone's, except across a write
//     that failed in a zone (counted in
//     mcsidecar_zone_write_failures_total).
const (
	zoneWritesAll   = "all"
	zoneWritesLocal = "local"
)

// zoneSpec is one zone as configured: its name and --upstream entries.
type zoneSpec struct {
	name    string
	entries []string
}

// zoneSpecs returns the zones to serve, the local one first and the others
// in the order given. Without zones it is one unnamed zone of Upstreams.
func (c *Config) zoneSpecs() ([]zoneSpec, error) {
	if len(c.ZoneUpstreams) == 0 {
		if c.Zone != "" {
			return nil, errors.New("--zone needs --upstream-zone: the servers of every zone")
		}
		if len(c.Upstreams) == 0 {
			return nil, errors.New("--upstream names no server: want one or more of " + upstream.EntryForms)
		}
		for _, u := range c.Upstreams {
			if _, err := upstream.ParseEntry(u); err != nil {
				return nil, err
			}
		}
		return []zoneSpec{{entries: c.Upstreams}}, nil
	}
	if len(c.Upstreams) > 0 {
		return nil, errors.New("give --upstream or --upstream-zone, not both")
	}
	if c.Zone == "" {
		return nil, errors.New("--upstream-zone needs --zone: the zone this sidecar serves")
	}
	var zones []zoneSpec
	static := map[string]string{} // server -> its zone
	for _, s := range c.ZoneUpstreams {
		name, list, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.TrimSpace(list) == "" {
			return nil, fmt.Errorf("--upstream-zone %q: want NAME=ENTRY[,ENTRY…]", s)
		}
		if slices.ContainsFunc(zones, func(z zoneSpec) bool { return z.name == name }) {
			return nil, fmt.Errorf("--upstream-zone: zone %q is given twice", name)
		}
		z := zoneSpec{name: name}
		for _, u := range strings.Split(list, ",") {
			u = strings.TrimSpace(u)
			if u == "" {
				return nil, fmt.Errorf("--upstream-zone %q: bad entry \"\": want %s", s, upstream.EntryForms)
			}
			e, err := upstream.ParseEntry(u)
			if bad := (*upstream.EntryError)(nil); errors.As(err, &bad) {
				return nil, fmt.Errorf("--upstream-zone %q: bad entry %q: %s", s, u, bad.Reason)
			} else if err != nil {
				return nil, err
			}
			if e.Static() {
				if other, dup := static[u]; dup && other != name {
					return nil, fmt.Errorf("--upstream-zone: server %s is in zones %q and %q", u, other, name)
				}
				static[u] = name
			}
			z.entries = append(z.entries, u)
		}
		zones = append(zones, z)
	}
	i := slices.IndexFunc(zones, func(z zoneSpec) bool { return z.name == strings.TrimSpace(c.Zone) })
	if i < 0 {
		names := make([]string, len(zones))
		for j, z := range zones {
			names[j] = z.name
		}
		return nil, fmt.Errorf("--zone %q is not one of the --upstream-zone names (%s)", c.Zone, strings.Join(names, ", "))
	}
	local := zones[i]
	zones = append(zones[:i], zones[i+1:]...)
	return append([]zoneSpec{local}, zones...), nil
}

// zone is one zone's current server set, swapped whole by discovery, and
// its counters.
type zone struct {
	zoneSpec
	up atomic.Pointer[upstream.Set]

	// Keys asked of the zone by result, the value bytes of its hits, and
	// writes that failed in it while another zone answered the client.
	reads         [numZoneResults]atomic.Uint64
	readBytes     atomic.Uint64
	writeFailures atomic.Uint64
}

// Results of one key asked of one zone.
const (
	zoneHit = iota
	zoneMiss
	zoneError
	numZoneResults
)

var zoneResultNames = [numZoneResults]string{zoneHit: "hit", zoneMiss: "miss", zoneError: "error"}

// Results of a fill. dropped: a write to the key through the sidecar
// raced it, and it was not sent or was deleted again (see writeGuard).
const (
	fillStored = iota
	fillNotStored
	fillFailed
	fillDropped
	numFillResults
)

var fillResultNames = [numFillResults]string{fillStored: "stored", fillNotStored: "not_stored", fillFailed: "failed", fillDropped: "dropped"}

// zoned reports whether the proxy serves zones.
func (p *Proxy) zoned() bool { return len(p.zones) > 1 || p.zones[0].name != "" }

// uniqueServers returns the current servers of every zone, each name once:
// DNS may name one server in two zones, and its metrics must be exported
// once.
func (p *Proxy) uniqueServers() []*upstream.Server {
	all := p.allServers()
	if len(p.zones) == 1 {
		return all
	}
	seen := make(map[string]bool, len(all))
	return slices.DeleteFunc(all, func(s *upstream.Server) bool {
		dup := seen[s.Name()]
		seen[s.Name()] = true
		return dup
	})
}

// allServers returns the current servers of every zone.
func (p *Proxy) allServers() []*upstream.Server {
	if len(p.zones) == 1 {
		return p.upstreams().Servers
	}
	var all []*upstream.Server
	for _, z := range p.zones {
		all = append(all, z.up.Load().Servers...)
	}
	return all
}

// zoneCalls is a connection's view of one zone: the zone's server set for
// the command being handled, a call per server, and one for commands.
type zoneCalls struct {
	up    *upstream.Set
	calls []*upstream.Call
	cmd   *upstream.Call
}

// call returns the call that holds o's result.
func (c *conn) call(o keyOwner) *upstream.Call {
	if o.zone == 0 {
		return c.calls[o.srv]
	}
	return c.zs[o.zone].calls[o.srv]
}

// ownerServer returns the server that o's result came from.
func (c *conn) ownerServer(o keyOwner) *upstream.Server {
	if o.zone == 0 {
		return c.up.Servers[o.srv]
	}
	return c.zs[o.zone].up.Servers[o.srv]
}

// askOtherZones looks up, zone after zone, the keys that the zones asked
// so far did not answer: misses, and keys whose server failed or is
// ejected. Each zone gets one mg per key, in one request per server, all
// servers at once; the answers are left in that zone's calls, and the
// owners of the keys answered point there.
func (c *conn) askOtherZones(r upstream.Retrieval) {
	if c.zs == nil {
		return
	}
	c.countZoneReads(0)
	multi := len(c.owners) > 1
	r.Meta = true
	for z := 1; z < len(c.zs); z++ {
		zc := &c.zs[z]
		for _, call := range zc.calls {
			call.Reset()
		}
		if multi {
			clear(c.seen)
		}
		asked := false
		for i := range c.owners {
			o := &c.owners[i]
			if o.srv < 0 {
				continue
			}
			call := c.call(*o)
			if call.Err == nil && call.Items[o.pos].Hit {
				continue
			}
			key := call.Keys[o.pos]
			if multi {
				if n, ok := c.seen[key]; ok {
					o.zone, o.srv, o.pos = n.zone, n.srv, n.pos
					continue
				}
			}
			s := zc.up.Pick(key, c.p.cfg.EjectRehash)
			next := zc.calls[s]
			o.zone, o.srv, o.pos = int32(z), int32(s), int32(len(next.Keys))
			o.written = c.p.writeCount(key) // for its fill
			next.Keys = append(next.Keys, key)
			asked = true
			if multi {
				if c.seen == nil {
					c.seen = make(map[string]keyOwner)
				}
				c.seen[key] = *o
			}
		}
		if !asked {
			return
		}
		fetchEach(zc.up.Servers, zc.calls, r)
		c.countZoneReads(z)
	}
}

// countZoneReads counts the keys asked of zone z by result.
func (c *conn) countZoneReads(z int) {
	zone := c.p.zones[z]
	for _, call := range c.zs[z].calls {
		if len(call.Keys) == 0 {
			continue
		}
		if call.Err != nil {
			zone.reads[zoneError].Add(uint64(len(call.Keys)))
			continue
		}
		var hits, bytes uint64
		for _, it := range call.Items {
			if it.Hit {
				hits++
				bytes += uint64(it.N)
			}
		}
		zone.reads[zoneHit].Add(hits)
		zone.reads[zoneMiss].Add(uint64(len(call.Keys)) - hits)
		zone.readBytes.Add(bytes)
	}
}

// fillLocal stores the hits that other zones answered into the local
// zone, as memcached holds them (envelopes included), with an add: a value
// the local zone got meanwhile is newer, and stays. A touch gives them its
// new exptime; other reads keep their remaining time to live. The replies
// to the client are written first, so a fill costs it no time. A fill that
// a write to its key through the sidecar raced is not sent, or deleted
// again (see writeGuard).
func (c *conn) fillLocal(r upstream.Retrieval) {
	if c.zs == nil || !c.p.cfg.ZoneFill || !slices.ContainsFunc(c.owners, c.fillable) {
		return
	}
	c.flush()
	// The local calls are done with: each carries its server's fills.
	for _, call := range c.calls {
		call.Reset()
	}
	bufs, notes := c.fillBuf[:0], c.fillNotes[:0]
	for i, o := range c.owners {
		if !c.fillable(o) {
			continue
		}
		call := c.call(o)
		it, key := &call.Items[o.pos], call.Keys[o.pos]
		if c.p.wroteSince(key, o.written) {
			c.p.fills[fillDropped].Add(1)
			continue
		}
		s := c.up.Pick(key, c.p.cfg.EjectRehash)
		local := c.calls[s]
		exptime := wire.ExptimeOf(it.TTL)
		if r.Touch {
			exptime = int64(r.Exptime)
		}
		start := len(bufs)
		bufs = appendStorage(bufs, "add", key, it.Flags, int32(exptime), it.N, 0, false)
		bufs = append(bufs, call.Value(int(o.pos))...)
		bufs = append(bufs, crlf...)
		// req is set once every fill is in bufs, which may move.
		local.Items = append(local.Items, upstream.Item{Off: start, N: len(bufs) - start})
		local.Replies++
		notes = append(notes, fillNote{owner: int32(i), srv: int32(s)})
	}
	c.fillBuf, c.fillNotes = bufs, notes
	var wg sync.WaitGroup
	for s, call := range c.calls {
		if call.Replies == 0 {
			continue
		}
		// The fills of one server are consecutive in bufs only when
		// grouped: gather them.
		call.Arena = call.Arena[:0]
		for _, it := range call.Items {
			call.Arena = append(call.Arena, bufs[it.Off:it.Off+it.N]...)
		}
		call.Req = call.Arena
		wg.Add(1)
		go func(srv *upstream.Server, call *upstream.Call) {
			defer wg.Done()
			srv.Get(call)
		}(c.up.Servers[s], call)
	}
	wg.Wait()
	for s, call := range c.calls {
		if call.Replies > 0 {
			c.filled(int32(s), call)
		}
	}
	if cap(c.fillBuf) > upstream.ArenaKeep {
		c.fillBuf = nil
	}
}

// sendOn runs one command on srv with call, pipelined with other clients'
// requests, and returns the line memcached answered.
func sendOn(call *upstream.Call, srv *upstream.Server, req, data []byte) ([]byte, error) {
	call.Reset()
	call.Req, call.Data = req, data
	srv.Get(call)
	if call.Err == nil && isServerError(call.Reply) {
		srv.CountServerError()
	}
	return call.Reply, call.Err
}

// send runs a command on key k's server in this zone.
func (zc *zoneCalls) send(k string, rehash bool, req, data []byte) (*upstream.Server, []byte, error) {
	srv := zc.up.Servers[zc.up.Pick(k, rehash)]
	line, err := sendOn(zc.cmd, srv, req, data)
	return srv, line, err
}

// writeFailed reports whether a write did not take in its zone.
func writeFailed(line []byte, err error) bool { return err != nil || isServerError(line) }

// sendLocal runs a command on key k's server, without zones.
func (c *conn) sendLocal(k string, req, data []byte) ([]byte, *upstream.Server, error) {
	srv := c.up.Servers[c.serverFor(k)]
	line, err := c.send(srv, req, data)
	return line, srv, err
}

// sendEvery runs a write that every zone takes as it is (set, delete,
// touch) on key k's server in each zone at once, and returns the reply of
// the local zone, or when it failed, of the first zone that answered, with
// the server that answered (the local one when none did). With
// --zone-writes=local it is sendDeciding.
func (c *conn) sendEvery(k string, req, data []byte) (line []byte, srv *upstream.Server, err error) {
	c.writing(k)
	defer c.wrote(k)
	if c.zs == nil {
		return c.sendLocal(k, req, data)
	}
	if c.p.cfg.ZoneWrites == zoneWritesLocal {
		line, _, srv, err = c.sendDeciding(k, req, data)
		return line, srv, err
	}
	rehash := c.p.cfg.EjectRehash
	type result struct {
		srv  *upstream.Server
		line []byte
		err  error
	}
	results := make([]result, len(c.zs))
	var wg sync.WaitGroup
	for z := 1; z < len(c.zs); z++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[z]
			r.srv, r.line, r.err = c.zs[z].send(k, rehash, req, data)
		}()
	}
	r := &results[0]
	r.srv, r.line, r.err = c.zs[0].send(k, rehash, req, data)
	wg.Wait()
	answer := 0
	for z := range results {
		if results[z].err == nil {
			answer = z
			break
		}
	}
	for z, r := range results {
		if writeFailed(r.line, r.err) {
			c.p.zones[z].writeFailures.Add(1)
		}
	}
	r = &results[answer]
	return r.line, r.srv, r.err
}

// sendDeciding runs a write that takes only where the item is as the
// client expects it (replace, cas, append, prepend, incr, decr) on the
// zones in order, the local one first, until one takes it: a zone may
// lack a copy another has (dropped after an incr, not yet filled), and a
// cas token may come from the zone that answered a gets. It returns the
// reply of the zone that took it, with the zone and its server. When none
// does, the reply is the first zone's that answered (EXISTS if any zone
// said so); when none answered, the local server and its error. A refusal
// of the request itself (CLIENT_ERROR, SERVER_ERROR) ends the search.
func (c *conn) sendDeciding(k string, req, data []byte) (line []byte, z int, srv *upstream.Server, err error) {
	c.writing(k)
	defer c.wrote(k)
	if c.zs == nil {
		line, srv, err = c.sendLocal(k, req, data)
		return line, 0, srv, err
	}
	rehash := c.p.cfg.EjectRehash
	answer := -1 // the zone whose reply answers when none takes the write
	var firstErr error
	var firstSrv *upstream.Server
	for z := range c.zs {
		srv, line, err = c.zs[z].send(k, rehash, req, data)
		if writeFailed(line, err) {
			c.p.zones[z].writeFailures.Add(1)
		}
		if err != nil {
			if z == 0 {
				firstErr, firstSrv = err, srv
			}
			continue
		}
		switch replyOutcome(line) {
		case outcomeStored, outcomeOK, outcomeClientError, outcomeUpstreamError:
			return line, z, srv, nil
		case outcomeExists:
			answer = z
		default: // NOT_FOUND, NOT_STORED
			if answer < 0 {
				answer = z
			}
		}
	}
	if answer < 0 {
		return nil, 0, firstSrv, firstErr
	}
	zc := &c.zs[answer]
	return zc.cmd.Reply, answer, zc.up.Servers[zc.up.Pick(k, rehash)], nil
}

// sendAdd runs an add on every zone at once. It stores only if no zone
// holds the key: when one does, the client gets its NOT_STORED, and the
// copies this add created in the other zones are deleted again (they will
// be filled from the zone that had the key). With --zone-writes=local it
// is the local zone's add, or the first zone's that answers.
func (c *conn) sendAdd(k string, req, data []byte) (line []byte, srv *upstream.Server, err error) {
	c.writing(k)
	defer c.wrote(k)
	if c.zs == nil {
		return c.sendLocal(k, req, data)
	}
	if c.p.cfg.ZoneWrites == zoneWritesLocal {
		for z := range c.zs {
			if srv, line, err = c.zs[z].send(k, c.p.cfg.EjectRehash, req, data); err == nil {
				return line, srv, nil
			}
			c.p.zones[z].writeFailures.Add(1)
		}
		return line, srv, err
	}
	line, srv, err = c.sendEvery(k, req, data)
	if err != nil {
		return line, srv, err
	}
	held := -1
	for z := range c.zs {
		if replyOutcome(c.zs[z].cmd.Reply) == outcomeNotStored { // NOT_STORED, or ms's NS
			held = z
			break
		}
	}
	if held < 0 {
		return line, srv, nil
	}
	for z := range c.zs {
		if replyOutcome(c.zs[z].cmd.Reply) == outcomeStored {
			c.alignReq = appendKeyCommand(c.alignReq[:0], "delete ", k, nil)
			c.zs[z].send(k, c.p.cfg.EjectRehash, c.alignReq, nil)
		}
	}
	zc := &c.zs[held]
	return zc.cmd.Reply, zc.up.Servers[zc.up.Pick(k, c.p.cfg.EjectRehash)], nil
}

// modifyInZones runs the read-modify-write of an enveloped item (append,
// prepend, incr, decr) with rmw on key k's server in the first zone whose
// server is not ejected; when the item is missing there, in the next zone
// that has one, and so on: the same search as sendDeciding. The zone that
// changed the item decides, and the others drop their copy.
func (c *conn) modifyInZones(k string, rmw func(srv *upstream.Server) error) error {
	c.writing(k)
	defer c.wrote(k)
	if c.zs == nil {
		return rmw(c.up.Servers[c.serverFor(k)])
	}
	rehash := c.p.cfg.EjectRehash
	var zones []int
	for z, zc := range c.zs {
		if !zc.up.Servers[zc.up.Pick(k, rehash)].Ejected() {
			zones = append(zones, z)
		}
	}
	if len(zones) == 0 {
		zones = append(zones, 0)
	}
	defer func() { c.quietMiss = false }()
	for i, z := range zones {
		zc := &c.zs[z]
		c.quietMiss, c.missed = i < len(zones)-1, false
		err := rmw(zc.up.Servers[zc.up.Pick(k, rehash)])
		if err != nil || !c.missed {
			if c.changed {
				c.alignDelete(z, k)
			}
			return err
		}
	}
	return nil
}

// alignZones brings key k in every zone but the deciding one, z, in line
// with it after a write there: req (a set of the value stored, or a
// delete) goes to all of them at once. Only with --zone-writes=all.
func (c *conn) alignZones(z int, k string, req, data []byte) {
	if c.zs == nil || c.p.cfg.ZoneWrites == zoneWritesLocal {
		return
	}
	rehash := c.p.cfg.EjectRehash
	var wg sync.WaitGroup
	for o := range c.zs {
		if o == z {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, line, err := c.zs[o].send(k, rehash, req, data); writeFailed(line, err) {
				c.p.zones[o].writeFailures.Add(1)
			}
		}()
	}
	wg.Wait()
}

// alignDelete drops key k from every zone but z, after a write there
// changed its value in place (append, prepend, incr, decr): the other
// copies cannot be brought to the same bytes without reading it.
func (c *conn) alignDelete(z int, k string) {
	if c.zs == nil {
		return
	}
	c.alignReq = appendKeyCommand(c.alignReq[:0], "delete ", k, nil)
	c.alignZones(z, k, c.alignReq, nil)
}
