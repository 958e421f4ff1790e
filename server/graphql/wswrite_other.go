//go:build !unix

package graphql

import (
	"net"
	"runtime"
)

// rawWriter takes nothing where the socket cannot be written without
// waiting: every write is a blocking one under WriteTimeout.
type rawWriter struct{}

func (*rawWriter) tryWrite(net.Conn, []byte) (int, error) { return 0, nil }

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
