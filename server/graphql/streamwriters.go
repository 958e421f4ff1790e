package graphql

import (
	"bytes"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/websocket"
)

// The shared writers of every stream connection, websockets (wsconn.go)
// and SSE streams taken from net/http (sseconn.go). A connection queues
// what it sends in a mailbox of its own and wakes the writers; a writer
// empties the mailbox with a write that never waits
// (websocket.SocketWriter). What the socket does not take at once is
// finished by a goroutine of the connection's own, under its write
// timeout, so a client that stops reading costs that goroutine until it
// is dropped, and nobody else waits for it.

// mailbox is a connection the shared writers empty: websockets and SSE
// streams (sseconn.go).
type mailbox interface {
	flush(scratch []byte, blocking bool, rest []byte) []byte
}

// streamWriters are the shared writers: at most GOMAXPROCS goroutines,
// started when connections have something to write and gone when none
// has.
type streamWriters struct {
	max int

	mu      sync.Mutex
	queue   []mailbox
	head    int
	workers int
}

func newStreamWriters() *streamWriters {
	return &streamWriters{max: max(2, runtime.GOMAXPROCS(0))}
}

func (p *streamWriters) schedule(c mailbox) {
	p.mu.Lock()
	p.queue = append(p.queue, c)
	start := p.workers < p.max
	if start {
		p.workers++
	}
	p.mu.Unlock()
	if start {
		go p.work()
	}
}

func (p *streamWriters) work() {
	var scratch []byte
	for {
		c := p.next()
		if c == nil {
			return
		}
		scratch = c.flush(scratch, false, nil)
		if cap(scratch) > 64<<10 {
			scratch = nil
		}
	}
}

// next takes the first connection of the queue, or, when it is empty, ends
// the calling worker (nil). The taken part of the queue is let go of once
// it is half the queue: under a load that never lets the queue empty, the
// queue would otherwise grow by every connection ever scheduled.
func (p *streamWriters) next() mailbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.head == len(p.queue) {
		p.queue, p.head = p.queue[:0], 0
		p.workers--
		return nil
	}
	c := p.queue[p.head]
	p.queue[p.head] = nil
	p.head++
	if p.head > len(p.queue)/2 {
		n := copy(p.queue, p.queue[p.head:])
		p.queue, p.head = p.queue[:n], 0
	}
	return c
}

// sockWriter is the write side of a connection the shared writers empty,
// a websocket or an SSE stream taken from net/http: the connection embeds
// it and sets owner to itself.
type sockWriter struct {
	nc           net.Conn
	log          *zerolog.Logger
	writers      *streamWriters
	writeTimeout time.Duration
	what         string // how a failed write is logged
	owner        sockOwner

	// dirty says the mailbox may have something; scheduled that a writer
	// owns the connection (queued, writing, or its own goroutine finishing
	// a write).
	dirty, scheduled atomic.Bool
	// raw writes without waiting; only the writer that owns the
	// connection uses it.
	raw websocket.SocketWriter
}

// sockOwner is what a sockWriter asks of its connection.
type sockOwner interface {
	// collect appends what the mailbox holds, framed, to b.
	collect(b []byte) []byte
	// written is called when a batch is fully written; false when that
	// batch ended the connection (which it has then closed).
	written() bool
	abort()
}

// wake schedules the connection's mailbox for writing.
func (w *sockWriter) wake() {
	w.dirty.Store(true)
	if w.scheduled.CompareAndSwap(false, true) {
		w.writers.schedule(w)
	}
}

// flush empties the mailbox. A writer calls it with blocking false: its
// writes never wait, and the rest of a write the socket did not take is
// finished by a goroutine of the connection's own, which goes on with
// blocking writes under writeTimeout until the mailbox is empty. scratch
// is the caller's buffer, returned for reuse.
func (w *sockWriter) flush(scratch []byte, blocking bool, rest []byte) []byte {
	for {
		b := rest
		rest = nil
		if b == nil {
			w.dirty.Store(false)
			scratch = w.owner.collect(scratch[:0])
			b = scratch
		}
		if len(b) > 0 {
			if blocking {
				_ = w.nc.SetWriteDeadline(time.Now().Add(w.writeTimeout))
				if _, err := w.nc.Write(b); err != nil {
					w.log.Debug().Err(err).Msg(w.what)
					w.owner.abort()
					return scratch
				}
			} else {
				n, err := w.raw.TryWrite(w.nc, b)
				if err != nil {
					w.log.Debug().Err(err).Msg(w.what)
					w.owner.abort()
					return scratch
				}
				if n < len(b) {
					go w.flush(nil, true, bytes.Clone(b[n:]))
					return scratch
				}
			}
			if !w.owner.written() {
				return scratch
			}
			continue
		}
		if blocking {
			_ = w.nc.SetWriteDeadline(time.Time{})
		}
		w.scheduled.Store(false)
		if !w.dirty.Load() || !w.scheduled.CompareAndSwap(false, true) {
			return scratch
		}
	}
}
