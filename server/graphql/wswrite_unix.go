//go:build unix

package graphql

import (
	"errors"
	"net"
	"runtime"
	"syscall"
)

// tryWrite writes what the socket takes of b without waiting: it returns
// how much that was (0 when the send buffer is full). A connection without
// a file descriptor (TLS) takes nothing this way, and is written by a
// blocking write instead.
func tryWrite(nc net.Conn, b []byte) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, nil //nolint:nilerr // the blocking write reports the real error
	}
	var n int
	var werr error
	err = raw.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, err := syscall.Write(int(fd), b[n:])
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN):
				return true
			case err != nil:
				werr = err
				return true
			}
			n += m
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return n, err
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
