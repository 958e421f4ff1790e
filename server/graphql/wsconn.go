package graphql

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/websocket"
	"github.com/dropline/dropline/resolvers"
)

// One websocket connection. Its goroutine is the handler's: it reads the
// client's messages and acts on them. Everything the server sends goes
// through the connection's mailbox: protocol messages (acks, pongs,
// errors, the messages of subscriptions executed on their own) queue in
// the outbox, and each shared subscription offers only the newest value of
// each SKU its group holds, so a connection that is not written to for a
// while holds at most one value per SKU, however many changes went by.
// The shared writers empty the mailbox (streamwriters.go), and one shared
// ticker checks the timed events: init timeout, keep-alives, pong
// deadline, token expiry (keepaliveticker.go). What is due when is the
// connection's state (wsstate.go).

// closeWait is how long a closing connection waits for the client's close
// frame after sending its own.
const closeWait = 5 * time.Second

// wsOutboxLimit bounds the protocol messages queued for one connection:
// the reader and the subscriptions executed on their own wait while more
// is queued (gqlgen's transport writes them synchronously).
const wsOutboxLimit = 64 << 10

// errClosing ends the reading of a connection the server is closing.
var errClosing = errors.New("the connection is closing")

// wsSub is one subscription (or other operation) of a connection.
type wsSub struct {
	id     string
	idJSON []byte
	// cancel ends an operation executed on its own, and release gives
	// back its place among the operations in flight; member is a shared
	// subscription's place in its group (whose end gives it back).
	cancel  context.CancelFunc
	release func()
	member  *groupMember
	ended   atomic.Bool // a shared subscription's end was decided
}

// wsConn is one websocket connection.
type wsConn struct {
	sockWriter // nc, log and the writing
	t          *wsTransport
	rd         *websocket.Reader
	header     http.Header
	exec       gqlgen.GraphExecutor
	proto      string
	legacy     bool
	stream     *streamConn

	ctx      context.Context // the connection's, after connection_init
	cancel   context.CancelFunc
	stopBase func() bool // the server's shutdown closing the connection

	mu       sync.Mutex
	state    wsState
	drained  *sync.Cond // the outbox was taken, or the close frame written, or the socket closed
	outbox   [][]byte
	outBytes int
	shared   []*wsSub // copied on change: the writer reads a snapshot
	active   map[string]*wsSub
}

func newWSConn(t *wsTransport, nc net.Conn, br *bufio.Reader, r *http.Request, exec gqlgen.GraphExecutor, proto string) *wsConn {
	c := &wsConn{
		sockWriter: sockWriter{nc: nc, log: zerolog.Ctx(r.Context()), writers: t.writers,
			writeTimeout: t.limits.WriteTimeout, what: "websocket write"},
		t:      t,
		header: r.Header,
		exec:   exec,
		proto:  proto,
		legacy: proto == subprotocolGraphQLWS || proto == "",
		stream: streamConnFrom(r.Context()),
		active: map[string]*wsSub{},
	}
	c.owner = c
	c.rd = websocket.NewReader(br, t.limits.MessageBytes, c)
	c.drained = sync.NewCond(&c.mu)
	c.ctx, c.cancel = context.WithCancel(r.Context())
	c.state = newWSState(time.Now().Add(t.limits.InitTimeout))
	// The server cancels hijacked connections' contexts when it stops.
	c.stopBase = context.AfterFunc(r.Context(), func() { c.closeWith(websocket.CloseNormal, "terminated") })
	return c
}

// serve runs the connection to its end.
func (c *wsConn) serve() {
	c.t.ticker.add(c)
	defer c.teardown()
	var err error
	switch c.proto {
	case "", subprotocolGraphQLWS, subprotocolGraphQLTransportWS:
		if err = c.initialize(); err == nil {
			err = c.run()
		}
	default:
		c.closeWith(websocket.CloseProtocolError, "unsupported negotiated subprotocol "+c.proto)
		err = errClosing
	}
	c.finish(err)
}

// initialize waits for connection_init and answers it, as gqlgen does.
func (c *wsConn) initialize() error {
	_, data, err := c.rd.ReadMessage()
	if err != nil {
		return err
	}
	kind, _, payload, err := decodeMessage(c.legacy, data)
	if err != nil {
		if errors.Is(err, errInvalidMessage) {
			c.sendConnectionError("invalid json")
		}
		c.closeWith(websocket.CloseProtocolError, "decoding error")
		return errClosing
	}
	switch kind {
	case kindInit:
		var ip transport.InitPayload
		if len(payload) > 0 {
			ip = transport.InitPayload{}
			if err := json.Unmarshal(payload, &ip); err != nil {
				return fmt.Errorf("decoding connection_init's payload: %w", err)
			}
		}
		ctx, expires, refusal := c.t.init(c.ctx, ip)
		if refusal != nil {
			c.sendConnectionError(refusal.reason)
			c.closeWith(refusal.code, refusal.reason)
			return errClosing
		}
		c.ctx = ctx
		c.sendKind(kindAck, "", nil)
		c.sendKind(kindKeepAlive, "", nil)
		c.mu.Lock()
		c.state.open(time.Now(), c.t.limits.PingInterval, !c.legacy, expires)
		c.mu.Unlock()
		return nil
	case kindTerminate:
		c.closeWith(websocket.CloseNormal, "terminated")
	default:
		c.sendConnectionError("unexpected message " + kind.String())
		c.closeWith(websocket.CloseProtocolError, "unexpected message")
	}
	return errClosing
}

// run reads and acts on the client's messages until the connection ends.
func (c *wsConn) run() error {
	for {
		start := gqlgen.Now()
		_, data, err := c.rd.ReadMessage()
		if err != nil {
			return err
		}
		kind, id, payload, err := decodeMessage(c.legacy, data)
		if err != nil {
			c.log.Debug().Err(err).Msg("websocket error")
			c.closeWith(websocket.CloseNormal, "terminated")
			return errClosing
		}
		switch kind {
		case kindStart:
			c.subscribe(start, id, payload)
		case kindStop:
			c.stop(id)
		case kindTerminate:
			c.closeWith(websocket.CloseNormal, "terminated")
			return errClosing
		case kindPing:
			c.sendKind(kindPong, "", payload)
		case kindPong:
			c.mu.Lock()
			c.state.ponged()
			c.mu.Unlock()
		default:
			c.sendConnectionError("unexpected message " + kind.String())
			c.closeWith(websocket.CloseProtocolError, "unexpected message")
			return errClosing
		}
	}
}

// finish ends the conversation after err: it answers what the client did
// (its close, a protocol violation, a message over the limit) and, when
// the server is closing, waits for the client's close frame (reading and
// dropping anything before it, so no unread data turns the close into a
// reset), then returns for teardown to close the socket.
func (c *wsConn) finish(err error) {
	var peer *websocket.CloseError
	var proto *websocket.ProtocolError
	var big *websocket.TooBigError
	switch {
	case errors.As(err, &peer):
		c.closeWith(peer.Code, peer.Reason)
		c.waitCloseSent()
		return
	case errors.As(err, &proto):
		c.closeWith(proto.Code, proto.Reason)
	case errors.As(err, &big):
		c.closeWith(websocket.CloseMessageTooBig, big.Error())
	case errors.Is(err, errClosing):
	default:
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.log.Debug().Err(err).Msg("websocket error")
		}
		return
	}
	c.rd.AwaitClose()
}

// MessageBegins starts the deadline of a message: once its first frame
// has begun, the message must be complete within WriteTimeout, so a
// client trickling bytes, or frames, is cut off rather than holding its
// connection for ever (a subscriber may say nothing for hours between
// messages). It is the reader's hook (websocket.Hooks).
func (c *wsConn) MessageBegins() { c.setReadDeadline(time.Now().Add(c.t.limits.WriteTimeout)) }

// MessageEnds lifts the deadline MessageBegins set.
func (c *wsConn) MessageEnds() { c.setReadDeadline(time.Time{}) }

// Ping answers the client's ping.
func (c *wsConn) Ping(payload []byte) {
	c.send(websocket.AppendHeader(nil, websocket.OpPong, len(payload)), payload)
}

func (c *wsConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.state.closing() { // a closing connection's deadline is closeWait's
		_ = c.nc.SetReadDeadline(t)
	}
}

// subscribe starts an operation, as gqlgen's transport does; identical
// shareable subscriptions join their group instead of executing. An
// operation over the connection's cap on operations in flight (queries
// and mutations as well as subscriptions) is refused before it runs.
func (c *wsConn) subscribe(start time.Time, id string, payload json.RawMessage) {
	ctx := gqlgen.StartOperationTrace(c.ctx)
	req := &requestParams{}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(req); err != nil {
		c.sendError(id, &gqlerror.Error{Message: "invalid json"})
		c.sendKind(kindComplete, id, nil)
		return
	}
	params := req.params()
	params.ReadTime = gqlgen.TraceTiming{Start: start, End: gqlgen.Now()}
	params.Headers = c.header
	rc, errs := c.exec.CreateOperationContext(ctx, params)
	if errs != nil {
		resp := c.exec.DispatchError(gqlgen.WithOperationContext(ctx, rc), errs)
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			c.sendError(id, resp.Errors...)
		} else {
			c.sendResponse(id, &gqlgen.Response{Errors: errs})
		}
		c.sendKind(kindComplete, id, nil)
		return
	}
	ctx = gqlgen.WithOperationContext(ctx, rc)
	release := func() {}
	if c.stream != nil {
		var ok bool
		if release, ok = c.stream.AdmitOperation(); !ok {
			refused := gqlerror.List{gqlerror.WrapPath(nil, resolvers.ErrTooManyOperations)}
			c.sendResponse(id, c.exec.DispatchError(ctx, refused))
			c.sendKind(kindComplete, id, nil)
			return
		}
		ctx = resolvers.WithStream(ctx, admittedStream{c.stream})
	}
	if c.t.groups != nil && c.subscribeShared(ctx, rc, id, release) {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := &wsSub{id: id, cancel: cancel, release: release}
	c.mu.Lock()
	// An operation of its own is a goroutine until its answers are
	// queued: none is started while the outbox is over its bound, so a
	// client that sends operations without reading their answers is not
	// read from (and is dropped by WriteTimeout) instead of growing a
	// goroutine per operation.
	for c.outBytes > wsOutboxLimit && c.state.phase != wsClosed {
		c.drained.Wait()
	}
	c.active[id] = sub
	c.mu.Unlock()
	go c.execute(ctx, rc, sub)
}

// execute runs an operation on its own and sends its responses.
func (c *wsConn) execute(ctx context.Context, rc *gqlgen.OperationContext, sub *wsSub) {
	ctx, se := withSubscriptionErrors(ctx)
	defer func() {
		sub.release() // before the end is sent: the client may start another at once
		if r := recover(); r != nil {
			err := rc.Recover(ctx, r)
			var gqlerr *gqlerror.Error
			if !errors.As(err, &gqlerr) {
				gqlerr = &gqlerror.Error{}
				if err != nil {
					gqlerr.Message = err.Error()
				}
			}
			c.sendError(sub.id, gqlerr)
		}
		if errs := se.take(); len(errs) != 0 {
			c.sendError(sub.id, errs...)
		} else if c.ctx.Err() == nil {
			// A cancelled connection context closes the socket; complete would signal a normal end.
			c.sendKind(kindComplete, sub.id, nil)
		}
		c.mu.Lock()
		if c.active[sub.id] == sub {
			delete(c.active, sub.id)
		}
		c.mu.Unlock()
		sub.cancel()
	}()
	responses, ctx := c.exec.DispatchOperation(ctx, rc)
	for {
		resp := responses(ctx)
		if resp == nil {
			break
		}
		c.sendResponse(sub.id, resp)
	}
}

// subscribeShared joins the group of a shareable subscription, which
// calls release when the member ends; it reports false, leaving the
// operation (and release) to execute on its own, when the operation is not
// shareable.
func (c *wsConn) subscribeShared(ctx context.Context, rc *gqlgen.OperationContext, id string, release func()) bool {
	key, field, ok := shareKey(rc)
	if !ok {
		return false
	}
	m := c.t.groups.join(key, field, rc, c.exec) //nolint:contextcheck // a group outlives its first member: it runs on its own context
	m.release = release
	idJSON, _ := json.Marshal(id)
	sub := &wsSub{id: id, idJSON: idJSON, member: m}
	c.mu.Lock()
	if c.state.closing() {
		c.mu.Unlock()
		c.endShared(sub, "client")
		return true
	}
	c.active[id] = sub
	c.shared = append(slices.Clip(c.shared), sub)
	c.mu.Unlock()
	m.watch(&c.sockWriter)
	return true
}

// endShared ends a shared subscription once.
func (c *wsConn) endShared(sub *wsSub, reason string) bool {
	if !sub.ended.CompareAndSwap(false, true) {
		return false
	}
	sub.member.end(reason)
	c.mu.Lock()
	if c.active[sub.id] == sub {
		delete(c.active, sub.id)
	}
	if i := slices.Index(c.shared, sub); i >= 0 {
		c.shared = slices.Delete(slices.Clone(c.shared), i, i+1)
	}
	c.mu.Unlock()
	return true
}

// stop ends the subscription id at the client's request.
func (c *wsConn) stop(id string) {
	c.mu.Lock()
	sub := c.active[id]
	c.mu.Unlock()
	switch {
	case sub == nil:
	case sub.member == nil:
		sub.cancel()
	case c.endShared(sub, "client"):
		c.sendKind(kindComplete, id, nil)
	}
}

func (c *wsConn) sendResponse(id string, resp *gqlgen.Response) {
	b, err := json.Marshal(resp)
	if err != nil {
		panic(err)
	}
	idJSON, _ := json.Marshal(id)
	typ := typeName(c.legacy, kindData)
	n := dataMessageLen(b, idJSON, typ)
	frame := websocket.AppendHeader(make([]byte, 0, n+10), websocket.OpText, n)
	c.send(appendDataMessage(frame, b, idJSON, typ), nil)
}

func (c *wsConn) sendError(id string, errs ...*gqlerror.Error) {
	list := make([]error, len(errs))
	for i, err := range errs {
		list[i] = err
	}
	b, err := json.Marshal(list)
	if err != nil {
		panic(err)
	}
	c.sendKind(kindError, id, b)
}

func (c *wsConn) sendConnectionError(msg string) {
	b, err := json.Marshal(&gqlerror.Error{Message: msg})
	if err != nil {
		panic(err)
	}
	c.sendKind(kindConnError, "", b)
}

// sendKind sends a protocol message, if the protocol has the kind.
func (c *wsConn) sendKind(k wsKind, id string, payload json.RawMessage) {
	typ := typeName(c.legacy, k)
	if typ == "" {
		return
	}
	b, err := json.Marshal(&outMessage{Payload: payload, ID: id, Type: typ})
	if err != nil {
		return
	}
	c.send(websocket.TextFrame(b), nil)
}

// send queues a frame (header, then payload) for the writers, and waits
// while the outbox is over its bound.
func (c *wsConn) send(header, payload []byte) {
	frame := header
	if len(payload) > 0 {
		frame = append(slices.Clip(header), payload...)
	}
	c.mu.Lock()
	if c.state.closing() {
		c.mu.Unlock()
		return
	}
	c.outbox = append(c.outbox, frame)
	c.outBytes += len(frame)
	over := c.outBytes > wsOutboxLimit
	c.mu.Unlock()
	c.wake()
	if over {
		c.mu.Lock()
		for c.outBytes > wsOutboxLimit && c.state.phase != wsClosed {
			c.drained.Wait()
		}
		c.mu.Unlock()
	}
}

// closeWith starts the close handshake: the close frame goes out after
// what is queued, and nothing after it. The first close wins. gqlgen closes
// a connection whose context ended with 1000; when that was the token
// expiring, the client is told 4403 instead.
func (c *wsConn) closeWith(code int, reason string) {
	if code == websocket.CloseNormal && c.stream.tokenExpired() {
		code, reason = CloseForbidden, "Forbidden: token expired"
	}
	c.mu.Lock()
	if !c.state.to(wsCloseQueued) {
		c.mu.Unlock()
		return
	}
	c.outbox = append(c.outbox, websocket.CloseFrame(code, reason))
	subs := c.takeSubsLocked()
	c.mu.Unlock()
	c.endSubs(subs)
	c.wake()
}

// takeSubsLocked takes every subscription out of the connection: those it
// knows by id, and shared ones whose id a later subscription took.
func (c *wsConn) takeSubsLocked() []*wsSub {
	subs := make([]*wsSub, 0, len(c.active)+len(c.shared))
	for _, s := range c.active {
		subs = append(subs, s)
	}
	for _, s := range c.shared {
		if c.active[s.id] != s {
			subs = append(subs, s)
		}
	}
	clear(c.active)
	return subs
}

func (c *wsConn) endSubs(subs []*wsSub) {
	for _, s := range subs {
		if s.member != nil {
			c.endShared(s, "client")
		} else {
			s.cancel()
		}
	}
}

// waitCloseSent waits until the close frame is written or the connection
// is gone (a write that cannot finish is cut off by WriteTimeout).
func (c *wsConn) waitCloseSent() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.state.phase < wsCloseSent {
		c.drained.Wait()
	}
}

// abort closes the socket at once.
func (c *wsConn) abort() {
	c.mu.Lock()
	c.state.to(wsClosed)
	c.drained.Broadcast()
	c.mu.Unlock()
	_ = c.nc.Close()
}

// teardown releases everything the connection holds.
func (c *wsConn) teardown() {
	c.stopBase()
	c.t.ticker.remove(c)
	c.mu.Lock()
	c.state.to(wsClosed)
	c.outbox = nil
	subs := c.takeSubsLocked()
	c.drained.Broadcast()
	c.mu.Unlock()
	_ = c.nc.Close()
	c.endSubs(subs)
	c.cancel()
}

// collect takes what the mailbox holds, as frames appended to b.
func (c *wsConn) collect(b []byte) []byte {
	c.mu.Lock()
	if c.state.phase >= wsCloseSent {
		c.outbox, c.outBytes = nil, 0
		c.mu.Unlock()
		return b
	}
	out := c.outbox
	c.outbox, c.outBytes = nil, 0
	subs, closing := c.shared, c.state.closing()
	c.state.to(wsCloseWriting) // the close frame, when queued, is in out
	if len(out) > 0 {
		c.drained.Broadcast()
	}
	c.mu.Unlock()
	for _, f := range out {
		b = append(b, f...)
	}
	if closing {
		return b
	}
	typ := typeName(c.legacy, kindData)
	for _, s := range subs {
		b = c.appendShared(b, s, typ)
	}
	return b
}

// appendShared appends what a shared subscription has not had: the newest
// value of each of its SKUs, then its end if its group ended.
func (c *wsConn) appendShared(b []byte, s *wsSub, typ string) []byte {
	for !s.ended.Load() {
		slot, state, _ := s.member.take()
		switch state {
		case memberValue:
			n := dataMessageLen(slot.enc, s.idJSON, typ)
			b = appendDataMessage(websocket.AppendHeader(b, websocket.OpText, n), slot.enc, s.idJSON, typ)
			s.member.sent()
			continue
		case memberEnded:
			if c.endShared(s, "complete") && c.ctx.Err() == nil {
				b = c.appendKind(b, kindComplete, s.id, nil)
			}
		case memberDropped:
			if c.endShared(s, "dropped") {
				list, _ := json.Marshal([]error{resolvers.LiveDroppedError()})
				b = c.appendKind(b, kindError, s.id, list)
			}
		}
		break
	}
	return b
}

func (c *wsConn) appendKind(b []byte, k wsKind, id string, payload json.RawMessage) []byte {
	m, err := json.Marshal(&outMessage{Payload: payload, ID: id, Type: typeName(c.legacy, k)})
	if err != nil {
		return b
	}
	return append(websocket.AppendHeader(b, websocket.OpText, len(m)), m...)
}

// written is called when a batch is fully written; the connection goes on
// (the close frame, once written, leaves it to the reader to finish).
func (c *wsConn) written() bool {
	c.mu.Lock()
	sent := c.state.to(wsCloseSent)
	if sent {
		c.drained.Broadcast()
	}
	c.mu.Unlock()
	if sent {
		_ = c.nc.SetReadDeadline(time.Now().Add(closeWait))
	}
	return true
}

// beat does what is due on the connection at now: it is called by the
// keep-alive ticker.
func (c *wsConn) beat(now time.Time) {
	c.mu.Lock()
	due := c.state.due(now)
	c.mu.Unlock()
	var kind wsKind
	switch due {
	case dueNothing:
		return
	case dueInitTimeout:
		c.closeWith(websocket.CloseProtocolError, "connection initialisation timeout")
		return
	case dueExpired:
		c.closeWith(websocket.CloseNormal, "terminated")
		return
	case dueDead:
		c.abort()
		return
	case dueKeepAlive:
		kind = kindKeepAlive
	case duePing:
		kind = kindPing
	}
	m, _ := json.Marshal(&outMessage{Type: typeName(c.legacy, kind)})
	c.mu.Lock()
	if !c.state.closing() {
		c.outbox = append(c.outbox, websocket.TextFrame(m))
	}
	c.mu.Unlock()
	c.wake()
}
