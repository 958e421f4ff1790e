package websocket

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkTryWrite: a shared writer's write of a stock update (about 150
// bytes) to a loopback socket that is read as fast as it can be. Most of
// it is the system call; allocs/op is what each write costs the garbage
// collector, once per watcher per delivery.
func BenchmarkTryWrite(b *testing.B) {
	nc := discardingConn(b)
	var w SocketWriter
	msg := make([]byte, 150)
	b.ReportAllocs()
	for b.Loop() {
		// A full send buffer takes less (the reader is behind): that is
		// a write too.
		if _, err := w.TryWrite(nc, msg); err != nil {
			b.Fatal(err)
		}
	}
}

// discardingConn is a loopback connection whose other end reads and drops
// everything.
func discardingConn(tb testing.TB) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c)
		_ = c.Close()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = nc.Close() })
	return nc
}
