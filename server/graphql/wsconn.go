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
	"runtime"
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
// A shared writer (wsWriters) empties the mailbox with a write that never
// waits; what the socket does not take at once is finished by a goroutine
// of the connection's own, under WriteTimeout, so a client that stops
// reading costs that goroutine until it is dropped, and nobody else waits
// for it. Timed events (init timeout, keep-alives, pong deadline, token
// expiry) are checked by one shared ticker (wsKeepalive).

// closeWait is how long a closing connection waits for the client's close
// frame after sending its own.
const closeWait = 5 * time.Second

// wsOutboxLimit bounds the protocol messages queued for one connection:
// the reader and the subscriptions executed on their own wait while more
// is queued (gqlgen's transport writes them synchronously).
const wsOutboxLimit = 64 << 10

// wsKind is what a protocol message means, whichever protocol named it.
type wsKind int

const (
	kindInit wsKind = iota
	kindAck
	kindKeepAlive
	kindConnError
	kindTerminate
	kindStart
	kindStop
	kindData
	kindComplete
	kindError
	kindPing
	kindPong
)

// String names a kind as gqlgen's transport does in "unexpected message".
func (k wsKind) String() string {
	return [...]string{"init", "connection ack", "keep alive", "connection error", "connection close",
		"start", "stop subscription", "data", "complete", "error", "ping", "pong"}[k]
}

var (
	errInvalidMessage = errors.New("invalid message received")
	errBadClientType  = errors.New("invalid client->server message type")
	errClosing        = errors.New("the connection is closing")
)

// transportWSType and legacyWSType are the type names each protocol knows;
// an unknown one fails the decoding of the whole message.
type (
	transportWSType string
	legacyWSType    string
)

var (
	transportWSTypes = []string{"connection_init", "connection_ack", "subscribe", "next", "error", "complete", "ping", "pong"}
	legacyWSTypes    = []string{"connection_init", "connection_terminate", "start", "stop", "connection_ack",
		"connection_error", "data", "error", "complete", "ka"}
)

func (t *transportWSType) UnmarshalText(b []byte) error {
	if !slices.Contains(transportWSTypes, string(b)) {
		return fmt.Errorf("invalid message type %s", b)
	}
	*t = transportWSType(b)
	return nil
}

func (t *legacyWSType) UnmarshalText(b []byte) error {
	if !slices.Contains(legacyWSTypes, string(b)) {
		return fmt.Errorf("invalid message type %s", b)
	}
	*t = legacyWSType(b)
	return nil
}

// decodeMessage reads a client message of either protocol.
func decodeMessage(legacy bool, data []byte) (kind wsKind, id string, payload json.RawMessage, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if legacy {
		var m struct {
			Payload json.RawMessage `json:"payload,omitempty"`
			ID      string          `json:"id,omitempty"`
			Type    legacyWSType    `json:"type"`
		}
		if dec.Decode(&m) != nil {
			return 0, "", nil, errInvalidMessage
		}
		k, ok := map[legacyWSType]wsKind{"connection_init": kindInit, "connection_terminate": kindTerminate,
			"start": kindStart, "stop": kindStop, "connection_ack": kindAck, "connection_error": kindConnError,
			"data": kindData, "error": kindError, "complete": kindComplete, "ka": kindKeepAlive}[m.Type]
		if !ok {
			return 0, m.ID, m.Payload, errBadClientType
		}
		return k, m.ID, m.Payload, nil
	}
	var m struct {
		Payload json.RawMessage `json:"payload,omitempty"`
		ID      string          `json:"id,omitempty"`
		Type    transportWSType `json:"type"`
	}
	if dec.Decode(&m) != nil {
		return 0, "", nil, errInvalidMessage
	}
	k, ok := map[transportWSType]wsKind{"connection_init": kindInit, "subscribe": kindStart,
		"complete": kindStop, "ping": kindPing, "pong": kindPong}[m.Type]
	if !ok {
		return 0, m.ID, m.Payload, errBadClientType
	}
	return k, m.ID, m.Payload, nil
}

// outMessage is a server message as both protocols spell it.
type outMessage struct {
	Payload json.RawMessage `json:"payload,omitempty"`
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
}

// typeName is the protocol's name for a server message of kind k, or ""
// when the protocol has no such message (it is not sent).
func typeName(legacy bool, k wsKind) string {
	if legacy {
		switch k {
		case kindAck:
			return "connection_ack"
		case kindKeepAlive:
			return "ka"
		case kindConnError:
			return "connection_error"
		case kindData:
			return "data"
		case kindComplete:
			return "complete"
		case kindError:
			return "error"
		}
		return ""
	}
	switch k {
	case kindAck:
		return "connection_ack"
	case kindData:
		return "next"
	case kindComplete:
		return "complete"
	case kindError:
		return "error"
	case kindPing:
		return "ping"
	case kindPong:
		return "pong"
	}
	return ""
}

// dataMessageLen and appendDataMessage write a data message ("next", or
// "data" in the legacy protocol) as encoding/json writes outMessage: the
// payload is json.Marshal's output (compact and escaped already) and id
// is already JSON, so neither is passed over again, once per subscriber
// of every update.
func dataMessageLen(payload, id []byte, typ string) int {
	n := len(`{"payload":`) + len(payload) + len(`,"type":"`) + len(typ) + len(`"}`)
	if len(id) > 2 {
		n += len(`,"id":`) + len(id)
	}
	return n
}

func appendDataMessage(b, payload, id []byte, typ string) []byte {
	b = append(b, `{"payload":`...)
	b = append(b, payload...)
	if len(id) > 2 {
		b = append(b, `,"id":`...)
		b = append(b, id...)
	}
	b = append(b, `,"type":"`...)
	b = append(b, typ...)
	return append(b, `"}`...)
}

// wsSub is one subscription (or other operation) of a connection.
type wsSub struct {
	id     string
	idJSON []byte
	// cancel ends an operation executed on its own; member is a shared
	// subscription's place in its group.
	cancel context.CancelFunc
	member *groupMember
	ended  atomic.Bool // a shared subscription's end was decided
}

// wsConn is one websocket connection.
type wsConn struct {
	sockWriter // nc, log and the writing: closeInFlight below is its part
	t          *wsTransport
	rd         *websocket.Reader
	header     http.Header
	exec       gqlgen.GraphExecutor
	proto      string
	legacy     bool
	state      *streamConn

	ctx      context.Context // the connection's, after connection_init
	cancel   context.CancelFunc
	stopBase func() bool // the server's shutdown closing the connection

	// closeInFlight is the writer's: the batch being written ends with the
	// close frame.
	closeInFlight bool

	mu          sync.Mutex
	drained     *sync.Cond // the outbox was taken, or the connection closed
	outbox      [][]byte
	outBytes    int
	shared      []*wsSub // copied on change: the writer reads a snapshot
	active      map[string]*wsSub
	closing     bool // a close frame was queued: nothing more is
	closeQueued bool // ... and no writer has taken it yet
	closeSent   bool
	closed      bool // the TCP connection is closed
	// The keep-alive state, under mu.
	initDeadline time.Time // zero once connection_init was answered
	running      bool
	nextBeat     time.Time
	pongDeadline time.Time
	receivedPong bool
	expiresAt    time.Time
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
		state:  streamConnFrom(r.Context()),
		active: map[string]*wsSub{},
	}
	c.owner = c
	c.rd = websocket.NewReader(br, t.limits.MessageBytes, c)
	c.drained = sync.NewCond(&c.mu)
	c.ctx, c.cancel = context.WithCancel(r.Context())
	c.initDeadline = time.Now().Add(t.limits.InitTimeout)
	// The server cancels hijacked connections' contexts when it stops.
	c.stopBase = context.AfterFunc(r.Context(), func() { c.closeWith(websocket.CloseNormal, "terminated") })
	return c
}

// serve runs the connection to its end.
func (c *wsConn) serve() {
	c.t.beats.add(c)
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
		now := time.Now()
		c.mu.Lock()
		c.initDeadline = time.Time{}
		c.running = true
		c.expiresAt = expires
		c.nextBeat = now.Add(c.t.limits.PingInterval)
		if !c.legacy {
			c.pongDeadline = now.Add(2 * c.t.limits.PingInterval)
		}
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
			c.receivedPong = true
			c.pongDeadline = time.Time{}
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
	if !c.closing { // a closing connection's deadline is closeWait's
		_ = c.nc.SetReadDeadline(t)
	}
}

// subscribe starts an operation, as gqlgen's transport does; identical
// shareable subscriptions join their group instead of executing.
func (c *wsConn) subscribe(start time.Time, id string, payload json.RawMessage) {
	ctx := gqlgen.StartOperationTrace(c.ctx)
	params := &gqlgen.RawParams{}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(params); err != nil {
		c.sendError(id, &gqlerror.Error{Message: "invalid json"})
		c.sendKind(kindComplete, id, nil)
		return
	}
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
	if c.t.groups != nil && c.subscribeShared(ctx, rc, id) {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := &wsSub{id: id, cancel: cancel}
	c.mu.Lock()
	// An operation of its own is a goroutine until its answers are
	// queued: none is started while the outbox is over its bound, so a
	// client that sends operations without reading their answers is not
	// read from (and is dropped by WriteTimeout) instead of growing a
	// goroutine per operation.
	for c.outBytes > wsOutboxLimit && !c.closed {
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

// subscribeShared joins the group of a shareable subscription; it reports
// false, leaving the operation to execute on its own, when the operation
// is not shareable or the connection is at its subscription cap (the
// resolver then refuses it in its own words).
func (c *wsConn) subscribeShared(ctx context.Context, rc *gqlgen.OperationContext, id string) bool {
	key, field, ok := shareKey(rc)
	if !ok {
		return false
	}
	release := func() {}
	if st := resolvers.StreamFrom(ctx); st != nil {
		r, ok := st.AdmitSubscription()
		if !ok {
			return false
		}
		release = r
	}
	m := c.t.groups.join(key, field, rc, c.exec) //nolint:contextcheck // a group outlives its first member: it runs on its own context
	m.release = release
	idJSON, _ := json.Marshal(id)
	sub := &wsSub{id: id, idJSON: idJSON, member: m}
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		c.endShared(sub, "client")
		return true
	}
	c.active[id] = sub
	c.shared = append(slices.Clip(c.shared), sub)
	c.mu.Unlock()
	m.watch(c.wake)
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
	if c.closing || c.closed {
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
		for c.outBytes > wsOutboxLimit && !c.closed {
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
	if code == websocket.CloseNormal && c.state.tokenExpired() {
		code, reason = CloseForbidden, "Forbidden: token expired"
	}
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.closeQueued = true
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
	for !c.closeSent && !c.closed {
		c.drained.Wait()
	}
}

// abort closes the socket at once.
func (c *wsConn) abort() {
	c.mu.Lock()
	c.closed = true
	c.drained.Broadcast()
	c.mu.Unlock()
	_ = c.nc.Close()
}

// teardown releases everything the connection holds.
func (c *wsConn) teardown() {
	c.stopBase()
	c.t.beats.remove(c)
	c.mu.Lock()
	c.closed = true
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
	if c.closed || c.closeSent {
		c.outbox, c.outBytes = nil, 0
		c.mu.Unlock()
		return b
	}
	out := c.outbox
	c.outbox, c.outBytes = nil, 0
	subs, closing := c.shared, c.closing
	c.closeInFlight = c.closeQueued
	c.closeQueued = false
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
	if !c.closeInFlight {
		return true
	}
	c.closeInFlight = false
	c.mu.Lock()
	c.closeSent = true
	c.drained.Broadcast()
	c.mu.Unlock()
	_ = c.nc.SetReadDeadline(time.Now().Add(closeWait))
	return true
}

// sockWriter is the write side of a connection the shared writers empty,
// a websocket or an SSE stream taken from net/http: the connection embeds
// it and sets owner to itself.
type sockWriter struct {
	nc           net.Conn
	log          *zerolog.Logger
	writers      *wsWriters
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

// beat does what is due on the connection at now: it is called by the
// keep-alive ticker.
func (c *wsConn) beat(now time.Time) {
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		return
	}
	switch {
	case !c.initDeadline.IsZero() && !now.Before(c.initDeadline):
		c.mu.Unlock()
		c.closeWith(websocket.CloseProtocolError, "connection initialisation timeout")
		return
	case !c.running:
		c.mu.Unlock()
		return
	case !c.expiresAt.IsZero() && !now.Before(c.expiresAt):
		c.mu.Unlock()
		c.closeWith(websocket.CloseNormal, "terminated")
		return
	case !c.pongDeadline.IsZero() && !now.Before(c.pongDeadline):
		// No pong for two intervals: the connection is dead.
		c.mu.Unlock()
		c.abort()
		return
	}
	var kind wsKind = -1
	if !now.Before(c.nextBeat) {
		c.nextBeat = now.Add(c.t.limits.PingInterval)
		if c.legacy {
			kind = kindKeepAlive
		} else {
			kind = kindPing
			if c.receivedPong {
				c.pongDeadline = now.Add(2 * c.t.limits.PingInterval)
			}
			c.receivedPong = false
		}
	}
	c.mu.Unlock()
	if kind >= 0 {
		typ := typeName(c.legacy, kind)
		m, _ := json.Marshal(&outMessage{Type: typ})
		c.mu.Lock()
		if !c.closing && !c.closed {
			c.outbox = append(c.outbox, websocket.TextFrame(m))
		}
		c.mu.Unlock()
		c.wake()
	}
}

// mailbox is a connection the shared writers empty: websockets and SSE
// streams (sseconn.go).
type mailbox interface {
	flush(scratch []byte, blocking bool, rest []byte) []byte
}

// beater is a connection the keep-alive ticker visits.
type beater interface{ beat(now time.Time) }

// wsWriters are the shared writers: at most GOMAXPROCS goroutines, started
// when connections have something to write and gone when none has.
type wsWriters struct {
	max int

	mu      sync.Mutex
	queue   []mailbox
	head    int
	workers int
}

func newWSWriters() *wsWriters {
	return &wsWriters{max: max(2, runtime.GOMAXPROCS(0))}
}

func (p *wsWriters) schedule(c mailbox) {
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

func (p *wsWriters) work() {
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
func (p *wsWriters) next() mailbox {
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

// wsKeepalive is the one ticker of every connection's timed events. It
// runs while there are connections.
type wsKeepalive struct {
	tick time.Duration

	mu      sync.Mutex
	conns   map[beater]struct{}
	running bool
	due     []beater
}

func newWSKeepalive(l StreamLimits) *wsKeepalive {
	tick := min(250*time.Millisecond, l.InitTimeout/4, l.PingInterval/4)
	return &wsKeepalive{tick: max(tick, time.Millisecond), conns: map[beater]struct{}{}}
}

func (k *wsKeepalive) add(c beater) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.conns[c] = struct{}{}
	if !k.running {
		k.running = true
		go k.run()
	}
}

func (k *wsKeepalive) remove(c beater) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.conns, c)
}

func (k *wsKeepalive) run() {
	t := time.NewTicker(k.tick)
	defer t.Stop()
	for now := range t.C {
		k.mu.Lock()
		if len(k.conns) == 0 {
			k.running = false
			k.mu.Unlock()
			return
		}
		due := k.due[:0]
		for c := range k.conns {
			due = append(due, c)
		}
		k.mu.Unlock()
		for _, c := range due {
			c.beat(now)
		}
		clear(due)
		k.due = due
	}
}
