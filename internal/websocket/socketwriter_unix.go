//go:build unix

package websocket

import (
	"errors"
	"net"
	"syscall"
)

// SocketWriter writes to a connection's socket without waiting, so that a
// few shared writers can serve many connections and none of them waits
// for a client that reads slowly. It is the connection's own and used by
// one writer at a time (the one the connection is scheduled with), so it
// keeps what a write needs from one write to the next: the socket, taken
// once, and the function the poller calls with its descriptor. A write
// then allocates nothing, where taking the socket and making that
// function for every write cost four small allocations, once per watcher
// per delivery.
type SocketWriter struct {
	taken bool
	raw   syscall.RawConn // nil: the connection has no descriptor (TLS)
	write func(fd uintptr) bool

	// The write in progress.
	b   []byte
	n   int
	err error
}

// TryWrite writes what the socket takes of b without waiting: it returns
// how much that was (0 when the send buffer is full). A connection without
// a file descriptor (TLS) takes nothing this way, and is written by a
// blocking write instead.
func (r *SocketWriter) TryWrite(nc net.Conn, b []byte) (int, error) {
	if !r.taken {
		r.taken = true
		if sc, ok := nc.(syscall.Conn); ok {
			if raw, err := sc.SyscallConn(); err == nil {
				r.raw = raw
				r.write = r.writeFD
			}
		}
	}
	if r.raw == nil {
		return 0, nil // the blocking write reports any real error
	}
	r.b, r.n, r.err = b, 0, nil
	err := r.raw.Write(r.write)
	n, werr := r.n, r.err
	r.b, r.err = nil, nil
	if err == nil {
		err = werr
	}
	return n, err
}

// writeFD is the poller's callback: it writes until the socket is full.
func (r *SocketWriter) writeFD(fd uintptr) bool {
	for r.n < len(r.b) {
		m, err := syscall.Write(int(fd), r.b[r.n:])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return true
		case err != nil:
			r.err = err
			return true
		}
		r.n += m
	}
	return true
}
