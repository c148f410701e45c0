package main

import (
	"html/template"
	"io"
	"net/http"
	"net/http/pprof"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"mcsidecar/proxy"
)

// newRegistry returns a registry holding the proxy's metrics, the Go and
// process collectors, and mcsidecar_build_info.
func newRegistry(p *proxy.Proxy) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "mcsidecar_build_info",
		Help:        "Always 1; the labels name the running build.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	if err := p.Register(reg); err != nil {
		return nil, err
	}
	return reg, nil
}

// newHTTPHandler serves the operator's endpoints: /metrics, /healthz (the
// process is alive: it answers), /readyz (at least one upstream server
// answers), a status page at /, the pprof profiles and an execution trace.
func newHTTPHandler(p *proxy.Proxy, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := p.Ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		up := p.Upstreams()
		zoned := len(up) > 0 && up[0].Zone != ""
		statusPage.Execute(w, statusData{Version: version, GoVersion: runtime.Version(), Zoned: zoned, Upstreams: up})
	})
	return mux
}

type statusData struct {
	Version, GoVersion string
	Zoned              bool // the servers have zones: show them
	Upstreams          []proxy.UpstreamStatus
}

// statusPage is short on purpose: what runs, what it talks to, where the
// rest is. Everything else is in /metrics.
var statusPage = template.Must(template.New("status").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>mcsidecar</title></head>
<body>
<h1>mcsidecar {{.Version}}</h1>
<p>Built with {{.GoVersion}}.
<a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></p>
<h2>Upstream servers</h2>
<table>
<tr>{{if .Zoned}}<th>zone</th>{{end}}<th>server</th><th>in use</th><th>answers now</th><th>last request</th><th>requests</th><th>failed</th></tr>
{{range .Upstreams}}<tr>{{if $.Zoned}}<td>{{.Zone}}{{if .Local}} (local){{end}}</td>{{end}}<td>{{.Name}}</td><td>{{if .Ejected}}ejected{{else}}yes{{end}}</td><td>{{if .Err}}no: {{.Err}}{{else}}yes{{end}}</td><td>{{if .Failing}}failing{{else}}ok{{end}}</td><td>{{.Requests}}</td><td>{{.Errors}}</td></tr>
{{end}}</table>
</body></html>
`))
