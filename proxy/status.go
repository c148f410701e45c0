package proxy

import (
	"sync"

	"mcsidecar/proxy/upstream"
)

// UpstreamStatus is one upstream server's state, for the status page.
type UpstreamStatus struct {
	Name string
	// Zone is the server's zone, empty without zones; Local marks the
	// zone this sidecar serves.
	Zone  string
	Local bool
	// Err is nil when the server answered a version request just now.
	Err error
	// Ejected reports that the server is out after consecutive failures,
	// its keys answered without it until a probe finds it back.
	Ejected bool
	// Failing reports that the last client request sent to the server
	// could not connect or timed out, and none has succeeded since.
	Failing bool
	// Requests and Errors count the requests the server was sent and
	// those that failed, since the proxy started; a request refused
	// because the server is ejected is in neither.
	Requests, Errors uint64
}

// Upstreams asks every upstream server for its version, at once, and
// returns their states zone by zone, the local zone first, each in the
// selector's order. Each answer is bounded by the upstream timeouts.
func (p *Proxy) Upstreams() []UpstreamStatus {
	var servers []*upstream.Server
	var zoneOf []int
	for i, z := range p.zones {
		for _, s := range z.Up.Load().Servers {
			servers = append(servers, s)
			zoneOf = append(zoneOf, i)
		}
	}
	out := make([]UpstreamStatus, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Requests refused because the server is ejected were
			// never sent: they are neither requests nor failures here.
			var errs uint64
			for k := range upstream.NumKinds {
				if k != upstream.KindEjected {
					errs += s.Errors(k)
				}
			}
			out[i] = UpstreamStatus{Name: s.Name(), Zone: p.zones[zoneOf[i]].Name, Local: zoneOf[i] == 0, Err: s.Ping(), Ejected: s.Ejected(), Failing: s.Failing(),
				Requests: s.Requests(), Errors: errs}
		}()
	}
	wg.Wait()
	return out
}
