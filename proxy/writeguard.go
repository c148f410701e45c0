package proxy

// The sidecar's side of the write guard (proxy/internal/writeguard):
// which features store what reads fetched, and the local tier's entry of a
// key dropped at both marks of a write to it.

// guards reports whether anything stores what reads fetched, so that
// writes are counted: the tier, or zone fills.
func (p *Proxy) guards() bool {
	return p.tier != nil || p.cfg.ZoneFill && len(p.zones) > 1
}

// writingOf and wroteOf mark a write to upstream key k begun and ended,
// and drop the tier's entry of k at both.
func (p *Proxy) writingOf(k []byte) {
	p.guard.Writing(k)
	p.forgetOf(k)
}

func (p *Proxy) wroteOf(k []byte) {
	p.guard.Wrote(k)
	p.forgetOf(k)
}

func (p *Proxy) forgetOf(k []byte) {
	if p.tier != nil {
		p.tier.Delete(string(k))
	}
}

// flushing marks every stripe written, for a flush_all about to go
// upstream, and empties the tier (see writeguard.Guard.Flushing, which
// with a delay keeps it empty until memcached has surely acted on it).
// flushed ends the marks once memcached has answered, and empties the
// tier again.
func (p *Proxy) flushing(delay int32, withDelay bool) {
	p.guard.Flushing(delay, withDelay)
	if p.tier != nil {
		p.tier.Clear()
	}
}

func (p *Proxy) flushed() {
	p.guard.Flushed()
	if p.tier != nil {
		p.tier.Clear()
	}
}
