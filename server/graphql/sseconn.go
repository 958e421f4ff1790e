package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/resolvers"
)

// sseTransport serves GraphQL over SSE (a POST with Accept:
// text/event-stream) as gqlgen's SSE transport does, and takes a shared
// subscription's stream over HTTP/1 from net/http once its headers and
// first comment are out. The handler then returns, so net/http lets go of
// its goroutine of the connection (whose stack the whole handler chain
// grew), its buffers and the request; the stream costs one small goroutine
// of its own, a reader waiting for the client to go (the client sends
// nothing after its request), and its events are written by the shared
// writers (streamwriters.go), its keep-alives and token expiry checked by
// the shared ticker (keepaliveticker.go), as a websocket's are. It keeps its slots in the stream caps
// until it ends, and the server's shutdown ends it. The events are the
// bytes gqlgen's transport writes, each update encoded once per group
// (TestSSEAnswersLikeGqlgen). Everything else (queries, mutations and
// subscriptions that are not shared, requests gqlgen would refuse, and
// HTTP/2, where a connection cannot be taken) goes to gqlgen's transport.
type sseTransport struct {
	inner   transport.SSE
	limits  StreamLimits
	groups  *subscriptionGroups // nil: every subscription executed on its own
	writers *streamWriters
	ticker  *keepaliveTicker

	mu sync.Mutex
	// stopping is, for each server the transport has taken streams from,
	// a context cancelled when that server begins to shut down.
	stopping map[*http.Server]context.Context
}

func newSSE(l StreamLimits, groups *subscriptionGroups) *sseTransport {
	return &sseTransport{
		inner:    transport.SSE{KeepAlivePingInterval: l.PingInterval},
		limits:   l,
		groups:   groups,
		writers:  newStreamWriters(),
		ticker:   newKeepaliveTicker(l),
		stopping: map[*http.Server]context.Context{},
	}
}

var _ gqlgen.Transport = (*sseTransport)(nil)

// serverStopping returns a context that ends when the server of the
// request ctx begins to shut down (http.Server.Shutdown, which neither
// waits for nor closes a connection taken from it), or nil without one.
// It stays cancelled, so a stream taken while the server stops ends at
// once.
func (t *sseTransport) serverStopping(ctx context.Context) context.Context {
	srv, _ := ctx.Value(http.ServerContextKey).(*http.Server)
	if srv == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	stop := t.stopping[srv]
	if stop == nil {
		var cancel context.CancelFunc
		stop, cancel = context.WithCancel(context.Background())
		t.stopping[srv] = stop
		srv.RegisterOnShutdown(cancel)
	}
	return stop
}

func (t *sseTransport) Supports(r *http.Request) bool { return t.inner.Supports(r) }

// Do reads the body first: gqlgen's transport decodes only its own
// parameters, so a document id the body names (documentId, doc_id) is
// given to the operation by the executor (withDocumentID).
func (t *sseTransport) Do(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor) {
	if r.Body == nil {
		t.inner.Do(w, r, exec)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		t.inner.Do(w, r, exec)
		return
	}
	exec = withDocumentID(exec, body)
	if t.groups == nil || r.ProtoMajor != 1 {
		if t.groups != nil {
			exec = sharingExecutor{GraphExecutor: exec, groups: t.groups}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		t.inner.Do(w, r, exec)
		return
	}
	t.serveBody(w, r, exec, body)
}

// serveBody serves a shareable subscription itself and hands anything else
// to gqlgen's transport, which reads the body again and answers in its
// own words. Neither the body nor the operation stays referenced while a
// stream lasts (a group keeps its first member's operation).
func (t *sseTransport) serveBody(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor, body []byte) {
	m := t.joinShared(r, exec, body)
	if m == nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		t.inner.Do(w, r, sharingExecutor{GraphExecutor: exec, groups: t.groups})
		return
	}
	t.serveMember(w, r, m)
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// joinShared joins the group of a shareable subscription; nil for
// anything else.
func (t *sseTransport) joinShared(r *http.Request, exec gqlgen.GraphExecutor, body []byte) *groupMember {
	ctx := r.Context()
	start := gqlgen.Now()
	params := &gqlgen.RawParams{}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // as gqlgen's transports decode a body
	if err := dec.Decode(params); err != nil {
		return nil
	}
	params.Headers = r.Header
	params.ReadTime = gqlgen.TraceTiming{Start: start, End: gqlgen.Now()}
	rc, errs := exec.CreateOperationContext(ctx, params)
	if errs != nil {
		return nil
	}
	key, field, ok := shareKey(rc)
	if !ok {
		return nil
	}
	release := func() {}
	if st := resolvers.StreamFrom(ctx); st != nil {
		r, ok := st.AdmitOperation()
		if !ok {
			return nil // the resolver refuses it in its own words
		}
		release = r
	}
	m := t.groups.join(key, field, rc, exec) //nolint:contextcheck // a group outlives its first member: it runs on its own context
	m.release = release
	return m
}

// serveMember streams a member to its end: it takes the stream from
// net/http and returns, leaving it to its reader (sseConn.read).
func (t *sseTransport) serveMember(w http.ResponseWriter, r *http.Request, m *groupMember) {
	ctx := r.Context()

	// As gqlgen's transport: these headers, then a comment, flushed. The
	// connection is the stream's own from here, so it closes after it.
	h := w.Header()
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "close")
	h.Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, ":\n\n")
	rcw := http.NewResponseController(w)
	_ = rcw.Flush()
	nc, brw, err := rcw.Hijack()
	if err != nil {
		servePlainSSE(ctx, w, m)
		return
	}
	// Nothing more is read from the client: what it sent after its
	// request is dropped with net/http's buffers.
	_ = brw
	st := streamConnFrom(ctx)
	c := &sseConn{
		sockWriter: sockWriter{nc: nc, log: zerolog.Ctx(ctx), writers: t.writers,
			writeTimeout: t.limits.WriteTimeout, what: "sse write"},
		t:        t,
		member:   m,
		state:    st,
		chunked:  r.ProtoAtLeast(1, 1),
		nextBeat: time.Now().Add(t.limits.PingInterval),
	}
	c.owner = c
	// The request's context ends as the handler returns: from here the
	// stream ends with its client, its token's expiry (the ticker looks),
	// the server's shutdown or its group.
	c.stopServer = func() bool { return false }
	if stop := t.serverStopping(ctx); stop != nil {
		c.stopServer = context.AfterFunc(stop, c.finish)
	}
	c.end = st.keep()
	t.ticker.add(c)
	m.watch(&c.sockWriter)
	go c.read()
}

// servePlainSSE streams a member through the ResponseWriter, for a writer
// that cannot be taken over (none under net/http's HTTP/1).
func servePlainSSE(ctx context.Context, w http.ResponseWriter, m *groupMember) {
	rcw := http.NewResponseController(w)
	for {
		resp := m.next(ctx)
		if resp == nil {
			break
		}
		writeSSEResponse(w, resp)
		_ = rcw.Flush()
	}
	_, _ = io.WriteString(w, sseComplete)
	_ = rcw.Flush()
}

func writeSSEResponse(w io.Writer, resp *gqlgen.Response) {
	b, err := json.Marshal(resp)
	if err != nil {
		panic(err)
	}
	_, _ = fmt.Fprintf(w, sseNextPrefix+"%s\n\n", b)
}

const (
	sseNextPrefix = "event: next\ndata: "
	sseComplete   = "event: complete\n\n"
	ssePing       = ": ping\n\n"
)

// sseConn is one SSE stream of a shared subscription, taken from net/http.
type sseConn struct {
	sockWriter // nc, log and the writing: endInFlight below is its part
	t          *sseTransport
	member     *groupMember
	state      *streamConn // its slots in the stream caps, and its token's expiry
	end        func()      // gives back its slots in the stream caps
	stopServer func() bool // the server's shutdown ending the stream
	chunked    bool        // HTTP/1.1: the body is chunked, as net/http began it

	memberDone atomic.Bool // the member's end was decided
	// endInFlight is the writer's: the batch being written ends the stream.
	endInFlight bool

	mu        sync.Mutex
	outbox    []byte // framed keep-alives, and the end
	ending    bool   // the end was queued: nothing more is
	endQueued bool   // ... and no writer has taken it yet
	closed    bool
	nextBeat  time.Time
}

// read waits for the client to go (its connection closed, or closed by
// the stream: its end written, a write failed or timed out), dropping
// anything it sends, then releases what the stream holds. It is the one
// goroutine a stream keeps, so its stack stays small.
func (c *sseConn) read() {
	var buf [64]byte
	for {
		if _, err := c.nc.Read(buf[:]); err != nil {
			break
		}
	}
	c.stopServer()
	c.t.ticker.remove(c)
	c.mu.Lock()
	c.closed = true
	c.outbox = nil
	c.mu.Unlock()
	_ = c.nc.Close()
	c.endMember("client")
	c.end()
}

func (c *sseConn) endMember(reason string) bool {
	if !c.memberDone.CompareAndSwap(false, true) {
		return false
	}
	c.member.end(reason)
	return true
}

// finish queues the stream's end: complete, then the body's end.
func (c *sseConn) finish() {
	c.endMember("client")
	c.mu.Lock()
	if c.ending || c.closed {
		c.mu.Unlock()
		return
	}
	c.ending = true
	c.endQueued = true
	c.outbox = c.appendEnd(c.outbox)
	c.mu.Unlock()
	c.wake()
}

// appendChunk appends s as one piece of the body.
func (c *sseConn) appendChunk(b []byte, s string) []byte {
	b = c.chunkHead(b, len(s))
	b = append(b, s...)
	return c.chunkTail(b)
}

// chunkHead begins a piece of the body of n bytes: its size, when the body
// is chunked; chunkTail ends it.
func (c *sseConn) chunkHead(b []byte, n int) []byte {
	if !c.chunked {
		return b
	}
	b = strconv.AppendInt(b, int64(n), 16)
	return append(b, "\r\n"...)
}

func (c *sseConn) chunkTail(b []byte) []byte {
	if !c.chunked {
		return b
	}
	return append(b, "\r\n"...)
}

func (c *sseConn) appendEnd(b []byte) []byte {
	b = c.appendChunk(b, sseComplete)
	if c.chunked {
		b = append(b, "0\r\n\r\n"...)
	}
	return b
}

func (c *sseConn) appendEvent(b, enc []byte) []byte {
	b = c.chunkHead(b, len(sseNextPrefix)+len(enc)+2)
	b = append(b, sseNextPrefix...)
	b = append(b, enc...)
	b = append(b, "\n\n"...)
	return c.chunkTail(b)
}

// collect takes what the mailbox holds: keep-alives, the newest value of
// each SKU the member has not had, and the end.
func (c *sseConn) collect(b []byte) []byte {
	c.mu.Lock()
	if c.closed {
		c.outbox = nil
		c.mu.Unlock()
		return b
	}
	b = append(b, c.outbox...)
	c.outbox = c.outbox[:0]
	ending := c.ending
	c.endInFlight = c.endQueued
	c.endQueued = false
	c.mu.Unlock()
	if ending {
		return b
	}
	values := false
	for !c.memberDone.Load() {
		slot, state, _ := c.member.take()
		switch state {
		case memberValue:
			b = c.appendEvent(b, slot.enc)
			c.member.sent()
			values = true
			continue
		case memberEnded, memberDropped:
			reason := "complete"
			if state == memberDropped {
				reason = "dropped"
			}
			if c.endMember(reason) {
				c.mu.Lock()
				if !c.ending {
					c.ending = true
					c.endInFlight = true
					b = c.appendEnd(b)
				}
				c.mu.Unlock()
			}
		}
		break
	}
	if values {
		// gqlgen's transport pings only after a quiet interval.
		c.mu.Lock()
		c.nextBeat = time.Now().Add(c.t.limits.PingInterval)
		c.mu.Unlock()
	}
	return b
}

// abort closes the connection at once; the reader then ends.
func (c *sseConn) abort() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	_ = c.nc.Close()
}

// written is called when a batch is fully written: once the end is
// written the connection is closed.
func (c *sseConn) written() bool {
	if !c.endInFlight {
		return true
	}
	c.endInFlight = false
	c.abort()
	return false
}

// beat ends the stream once its token has expired (as gqlgen's transport
// does when the request's context ends), and queues a keep-alive when the
// stream has been quiet for a PingInterval; the keep-alive ticker calls
// it.
func (c *sseConn) beat(now time.Time) {
	if c.state.expiredAt(now) {
		c.finish()
		return
	}
	c.mu.Lock()
	if c.ending || c.closed || now.Before(c.nextBeat) {
		c.mu.Unlock()
		return
	}
	c.nextBeat = now.Add(c.t.limits.PingInterval)
	c.outbox = c.appendChunk(c.outbox, ssePing)
	c.mu.Unlock()
	c.wake()
}
