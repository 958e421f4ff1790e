package graphql

import (
	"bufio"
	"io"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/websocket"
)

// BenchmarkWSWrite: one protocol message through a websocket's whole write
// path, on the benchmark's goroutine (it plays the shared writer): queued
// in the connection's mailbox, collected, written to a loopback socket
// that is read as fast as it can be, and acknowledged.
func BenchmarkWSWrite(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c)
		_ = c.Close()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer nc.Close()
	limits := StreamLimits{}.withDefaults()
	m := newStreamMetrics(prometheus.NewRegistry())
	tr := newWebsocket(limits, newCORS(nil), nil, m, nil)
	writers := &streamWriters{max: 0, workers: 1} // no worker starts: the benchmark is the writer
	tr.writers = writers
	req := httptest.NewRequest("GET", "/graphql", nil)
	c := newWSConn(tr, nc, bufio.NewReader(nc), req, nil, subprotocolGraphQLTransportWS)
	frame := websocket.TextFrame([]byte(`{"id":"1","type":"next","payload":{"data":{"stockChanged":{"sku":"BENCH-1","available":17,"held":2,"sold":1,"total":20}}}}`))
	var scratch []byte
	b.ReportAllocs()
	for b.Loop() {
		c.send(frame, nil)
		scratch = writers.next(nil)[0].flush(scratch, false, nil)
	}
}
