package main

import (
	"net"
	"net/http"
	"sync/atomic"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/dropline/dropline/internal/otlpreceiver"
)

// otlpSink is an OTLP/HTTP trace receiver on loopback for --traces: it
// decodes each export, as a collector would, counts its spans and keeps
// nothing, so the server's tracing is measured with its exporter really
// sending.
type otlpSink struct {
	URL     string
	spans   atomic.Int64
	exports atomic.Int64
	srv     *http.Server
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{URL: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: otlpreceiver.Handler(s.count)} //nolint:gosec // loopback, for the length of a benchmark
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *otlpSink) count(export *coltracepb.ExportTraceServiceRequest) {
	n := 0
	for _, rs := range export.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += len(ss.GetSpans())
		}
	}
	s.spans.Add(int64(n))
	s.exports.Add(1)
}

func (s *otlpSink) Close() { _ = s.srv.Close() }
