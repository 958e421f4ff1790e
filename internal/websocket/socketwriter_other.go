//go:build !unix

package websocket

import (
	"net"
)

// SocketWriter takes nothing where the socket cannot be written without
// waiting: every write is then a blocking one, by the caller.
type SocketWriter struct{}

// TryWrite writes nothing: see the unix SocketWriter.
func (*SocketWriter) TryWrite(net.Conn, []byte) (int, error) { return 0, nil }
