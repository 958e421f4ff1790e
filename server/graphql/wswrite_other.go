//go:build !unix

package graphql

import (
	"net"
	"runtime"
)

// tryWrite takes nothing where the socket cannot be written without
// waiting: every write is a blocking one under WriteTimeout.
func tryWrite(net.Conn, []byte) (int, error) { return 0, nil }

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
