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

// scheduleAll queues many connections at once, as a change of a group
// does for its websocket and SSE members: one lock for all of them, and
// as many writers started as the queue can use.
func (p *streamWriters) scheduleAll(cs []*sockWriter) {
	if len(cs) == 0 {
		return
	}
	p.mu.Lock()
	for _, c := range cs {
		p.queue = append(p.queue, c)
	}
	start := min(p.max-p.workers, (len(p.queue)-p.head+writerBatch-1)/writerBatch)
	p.workers += max(start, 0)
	p.mu.Unlock()
	for range start {
		go p.work()
	}
}

// writerBatch is how many connections a writer takes from the queue at
// once: ten thousand watchers of one SKU are ten thousand entries per
// change, and the writers would otherwise take the queue's lock once
// each, in turn with each other and with whoever is queueing.
const writerBatch = 32

func (p *streamWriters) work() {
	var scratch []byte
	batch := make([]mailbox, 0, writerBatch)
	for {
		batch = p.next(batch[:0])
		if len(batch) == 0 {
			return
		}
		for i, c := range batch {
			scratch = c.flush(scratch, false, nil)
			if cap(scratch) > 64<<10 {
				scratch = nil
			}
			batch[i] = nil
		}
	}
}

// next appends to batch up to writerBatch connections from the head of the
// queue (at least one when the queue is not empty, and no more than the
// writers' fair share of it), or, when it is empty, ends the calling
// worker (an empty batch). The taken part of the queue is let go of once
// it is half the queue: under a load that never lets the queue empty, the
// queue would otherwise grow by every connection ever scheduled.
func (p *streamWriters) next(batch []mailbox) []mailbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	left := len(p.queue) - p.head
	if left == 0 {
		p.queue, p.head = p.queue[:0], 0
		p.workers--
		return batch
	}
	n := min(writerBatch, max(1, left/max(p.workers, 1)))
	batch = append(batch, p.queue[p.head:p.head+n]...)
	clear(p.queue[p.head : p.head+n])
	p.head += n
	if p.head > len(p.queue)/2 {
		m := copy(p.queue, p.queue[p.head:])
		clear(p.queue[m:])
		p.queue, p.head = p.queue[:m], 0
	}
	return batch
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
	if w.markDirty() {
		w.writers.schedule(w)
	}
}

// markDirty says the mailbox has something; true when the caller is to
// schedule the connection (no writer owns it yet).
func (w *sockWriter) markDirty() bool {
	w.dirty.Store(true)
	return w.scheduled.CompareAndSwap(false, true)
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
