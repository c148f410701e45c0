package proxy

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Meta replies memcached 1.6 gives to the read-modify-write of an
// enveloped item.
var (
	metaValue    = []byte("VA ")
	metaMiss     = []byte("EN\r\n")
	metaStored   = []byte("HD\r\n")
	metaExists   = []byte("EX\r\n")
	metaNotFound = []byte("NF\r\n")
	metaNotStore = []byte("NS\r\n")
)

// maxRelativeTTL is the longest exptime memcached reads as seconds from
// now; a larger one is a Unix time.
const maxRelativeTTL = 60 * 60 * 24 * 30

// metaItem is what a read-modify-write needs of an item besides its value.
type metaItem struct {
	flags uint32
	cas   uint64
	ttl   int32 // seconds left to live; -1: never expires
}

// getForUpdate reads key's item with memcached's meta get, which, unlike
// gets, also tells how long the item has left to live, so that writing it
// back keeps its expiry as memcached's own append and incr do. The value is
// read into dst, grown once to its size. found is false on a miss.
func (p *rawPool) getForUpdate(key string, dst []byte) (value []byte, it metaItem, found bool, err error) {
	err = p.do(func(c *rawConn) error {
		found = false
		c.rw.WriteString("mg ")
		c.rw.WriteString(key)
		c.rw.WriteString(" v f c t\r\n")
		if err := c.rw.Flush(); err != nil {
			return err
		}
		line, err := c.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		if bytes.Equal(line, metaMiss) {
			return nil
		}
		rest, ok := bytes.CutPrefix(line, metaValue)
		if !ok || !bytes.HasSuffix(rest, crlf) {
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		var words [8][]byte
		w, _ := tokenize(words[:0], rest[:len(rest)-2], len(words))
		if len(w) == 0 {
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		size, ok := parseUint64(w[0])
		if !ok || size > 1<<30 {
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		it = metaItem{ttl: -1}
		for _, f := range w[1:] {
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case 'f':
				it.flags, ok = parseUint32(f[1:])
			case 'c':
				it.cas, ok = parseUint64(f[1:])
			case 't':
				it.ttl, ok = parseInt32(f[1:])
			}
			if !ok {
				return fmt.Errorf("%w: %q", errUnexpectedReply, line)
			}
		}
		value = slices.Grow(dst[:0], int(size))[:size]
		if err := readValue(c.rw.Reader, value); err != nil {
			return err
		}
		found = true
		return nil
	})
	return value, it, found, err
}

// storeIfUnchanged writes value under key with memcached's meta set, only
// if the item still has it.cas, with the item's flags and remaining time to
// live. conflict reports that the item changed or went away since it was
// read; notStored that memcached refused the value (too large). Unlike
// other requests on this pool it is never sent twice: when a reply is lost
// the write may have happened, and joining twice would corrupt the value.
func (p *rawPool) storeIfUnchanged(key string, it metaItem, value []byte) (conflict, notStored bool, err error) {
	c, _, err := p.get()
	if err != nil {
		return false, false, err
	}
	ttl := int64(it.ttl)
	switch {
	case ttl < 0:
		ttl = 0 // never expires
	case ttl == 0:
		ttl = 1
	case ttl > maxRelativeTTL:
		ttl += time.Now().Unix()
	}
	err = p.run(c, func(c *rawConn) error {
		b := append(c.rw.AvailableBuffer(), "ms "...)
		b = append(b, key...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(value)), 10)
		b = append(b, " C"...)
		b = strconv.AppendUint(b, it.cas, 10)
		b = append(b, " F"...)
		b = strconv.AppendUint(b, uint64(it.flags), 10)
		b = append(b, " T"...)
		b = strconv.AppendInt(b, ttl, 10)
		b = append(b, crlf...)
		c.rw.Write(b)
		c.rw.Write(value)
		c.rw.Write(crlf)
		if err := c.rw.Flush(); err != nil {
			return err
		}
		line, err := c.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		switch {
		case bytes.Equal(line, metaStored):
		case bytes.Equal(line, metaExists), bytes.Equal(line, metaNotFound):
			conflict = true
		case bytes.Equal(line, metaNotStore), bytes.Equal(line, replyTooLarge):
			notStored = true
		default:
			return fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
		return nil
	})
	return conflict, notStored, err
}
