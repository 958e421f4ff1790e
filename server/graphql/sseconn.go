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
// first comment are out: the stream then costs one goroutine (the
// handler's, waiting for the client to go), and its events are written by
// the shared writers, its keep-alives queued by the shared ticker, as a
// websocket's are (wsconn.go). The events are the bytes gqlgen's transport
// writes, each update encoded once per group (TestSSEAnswersLikeGqlgen).
// Everything else (queries, mutations and subscriptions that are not
// shared, requests gqlgen would refuse, and HTTP/2, where a connection
// cannot be taken) goes to gqlgen's transport.
type sseTransport struct {
	inner   transport.SSE
	limits  StreamLimits
	groups  *subscriptionGroups // nil: every subscription executed on its own
	writers *wsWriters
	beats   *wsKeepalive
}

func newSSE(l StreamLimits, groups *subscriptionGroups) *sseTransport {
	return &sseTransport{
		inner:   transport.SSE{KeepAlivePingInterval: l.PingInterval},
		limits:  l,
		groups:  groups,
		writers: newWSWriters(),
		beats:   newWSKeepalive(l),
	}
}

var _ gqlgen.Transport = (*sseTransport)(nil)

func (t *sseTransport) Supports(r *http.Request) bool { return t.inner.Supports(r) }

func (t *sseTransport) Do(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor) {
	if t.groups == nil {
		t.inner.Do(w, r, exec)
		return
	}
	if r.ProtoMajor != 1 || r.Body == nil {
		t.inner.Do(w, r, sharingExecutor{GraphExecutor: exec, groups: t.groups})
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
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
		r, ok := st.AdmitSubscription()
		if !ok {
			return nil // the resolver refuses it in its own words
		}
		release = r
	}
	m := t.groups.join(key, field, rc, exec) //nolint:contextcheck // a group outlives its first member: it runs on its own context
	m.release = release
	return m
}

// serveMember streams a member to its end.
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
	_ = brw // nothing more is read from the client: its bytes are dropped
	c := &sseConn{
		sockWriter: sockWriter{nc: nc, log: zerolog.Ctx(ctx), writers: t.writers,
			writeTimeout: t.limits.WriteTimeout, what: "sse write"},
		t:        t,
		member:   m,
		chunked:  r.ProtoAtLeast(1, 1),
		nextBeat: time.Now().Add(t.limits.PingInterval),
	}
	c.owner = c
	c.serve(ctx)
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
	chunked    bool // HTTP/1.1: the body is chunked, as net/http began it

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

// serve runs the stream until the client goes or its end is written.
func (c *sseConn) serve(ctx context.Context) {
	c.t.beats.add(c)
	// The context ends with the token's expiry or the server's shutdown:
	// gqlgen's transport then completes the stream.
	stop := context.AfterFunc(ctx, c.finish)
	c.member.watch(c.wake)
	var buf [64]byte
	for {
		if _, err := c.nc.Read(buf[:]); err != nil {
			break
		}
	}
	stop()
	c.t.beats.remove(c)
	c.mu.Lock()
	c.closed = true
	c.outbox = nil
	c.mu.Unlock()
	_ = c.nc.Close()
	c.endMember("client")
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

// appendChunk appends data as one piece of the body.
func (c *sseConn) appendChunk(b []byte, parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if c.chunked {
		b = strconv.AppendInt(b, int64(n), 16)
		b = append(b, "\r\n"...)
	}
	for _, p := range parts {
		b = append(b, p...)
	}
	if c.chunked {
		b = append(b, "\r\n"...)
	}
	return b
}

func (c *sseConn) appendEnd(b []byte) []byte {
	b = c.appendChunk(b, sseComplete)
	if c.chunked {
		b = append(b, "0\r\n\r\n"...)
	}
	return b
}

func (c *sseConn) appendEvent(b, enc []byte) []byte {
	n := len(sseNextPrefix) + len(enc) + 2
	if c.chunked {
		b = strconv.AppendInt(b, int64(n), 16)
		b = append(b, "\r\n"...)
	}
	b = append(b, sseNextPrefix...)
	b = append(b, enc...)
	b = append(b, "\n\n"...)
	if c.chunked {
		b = append(b, "\r\n"...)
	}
	return b
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

// abort closes the connection at once; the handler's read then ends.
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

// beat queues a keep-alive when the stream has been quiet for a
// PingInterval; the keep-alive ticker calls it.
func (c *sseConn) beat(now time.Time) {
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
