//go:build !unix

package graphql

import (
	"net"
)

// rawWriter takes nothing where the socket cannot be written without
// waiting: every write is a blocking one under WriteTimeout.
type rawWriter struct{}

func (*rawWriter) tryWrite(net.Conn, []byte) (int, error) { return 0, nil }
