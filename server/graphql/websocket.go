package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	coderws "github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/auth"
)

// Websocket close codes Dropline sends beyond gqlgen's own (1000 normal,
// 1002 protocol error, e.g. no connection_init within InitTimeout). They
// follow the graphql-ws library's CloseCode: its client retries after 4403
// (with fresh connectionParams, hence a fresh token) and gives up after 4429.
const (
	// CloseForbidden: the token in connection_init or in the upgrade's
	// Authorization header is invalid, or the connection's token expired.
	CloseForbidden = 4403
	// CloseTooManyConnections: the principal has ConnsPerPrincipal open.
	CloseTooManyConnections = 4429
)

// newWebsocket is the websocket transport: graphql-transport-ws (the
// graphql-ws library's protocol, used by Apollo Client, urql and Relay) and
// the legacy graphql-ws subprotocol, both served by gqlgen. Dropline adds
// the origin check, auth at connection_init, and bounded writes.
func newWebsocket(l StreamLimits, origins cors, v auth.Verifier, m *streamMetrics) transport.Websocket {
	readLimit := l.MessageBytes
	return transport.Websocket{
		Implementation:        wsImplementation{origins: origins, writeTimeout: l.WriteTimeout},
		InitFunc:              wsInit(v, m),
		InitTimeout:           l.InitTimeout,
		KeepAlivePingInterval: l.PingInterval, // legacy graphql-ws: "ka" messages
		PingPongInterval:      l.PingInterval, // graphql-transport-ws: ping, pong within 2 intervals
		PayloadReadLimit:      &readLimit,
		ErrorFunc: func(ctx context.Context, err error) {
			zerolog.Ctx(ctx).Debug().Err(err).Msg("websocket error")
		},
	}
}

// wsInit authenticates a websocket at connection_init. The token comes from
// the payload ("Authorization": "Bearer …", or "authToken": "…" as Apollo
// clients send it) or else from the upgrade request's Authorization header
// (already verified by auth.Middleware). No token is an anonymous
// connection, enough for stockChanged. A bad token anywhere closes the
// connection with 4403; a good one ends it with 4403 when it expires.
func wsInit(v auth.Verifier, m *streamMetrics) transport.WebsocketInitFunc {
	return func(ctx context.Context, payload transport.InitPayload) (context.Context, *transport.InitPayload, error) {
		refuse := func(code int, reason string) (context.Context, *transport.InitPayload, error) {
			ctx = transport.WithWebsocketCloseCode(ctx, code)
			ctx = transport.AppendCloseReason(ctx, reason)
			return ctx, nil, errors.New(reason)
		}
		if err := auth.AuthErrorFrom(ctx); err != nil {
			m.refused.WithLabelValues("bad_token").Inc()
			return refuse(CloseForbidden, "Forbidden: "+tokenProblem(err))
		}
		p, have := auth.PrincipalFrom(ctx)
		if header := initToken(payload); header != "" {
			var err error
			p, _, err = auth.FromHeader(v, header)
			if err != nil {
				m.refused.WithLabelValues("bad_token").Inc()
				return refuse(CloseForbidden, "Forbidden: "+tokenProblem(err))
			}
			have = true
			ctx = auth.WithPrincipal(ctx, p)
		}
		c := streamConnFrom(ctx)
		if !have || c == nil {
			return ctx, nil, nil
		}
		if !c.bindPrincipal(p) {
			m.refused.WithLabelValues("principal_limit").Inc()
			return refuse(CloseTooManyConnections, "Too many connections for this principal")
		}
		return c.expireAt(ctx, p.ExpiresAt), nil, nil
	}
}

// initToken returns the connection_init payload's token as an
// Authorization header value.
func initToken(p transport.InitPayload) string {
	if h := p.Authorization(); h != "" {
		return h
	}
	t := strings.TrimSpace(p.GetString("authToken"))
	if t == "" {
		return ""
	}
	if scheme, _, ok := strings.Cut(t, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return t
	}
	return "Bearer " + t
}

func tokenProblem(err error) string {
	if errors.Is(err, auth.ErrTokenExpired) {
		return "token expired"
	}
	return "invalid token"
}

// wsImplementation accepts websockets with coder/websocket, as gqlgen's own
// adapter does, plus two things that adapter cannot do: every write has a
// deadline (a client that stops reading is disconnected instead of
// parking the writer for ever), and a connection whose token expired is
// closed with 4403 instead of gqlgen's normal closure.
type wsImplementation struct {
	origins      cors
	writeTimeout time.Duration
}

// errOriginNotAllowed is a second line of defence: the CORS middleware
// already answers 403 to origins off the allow-list.
var errOriginNotAllowed = errors.New("websocket origin not allowed")

func (i wsImplementation) Accept(w http.ResponseWriter, r *http.Request, opts transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	if !i.origins.Allowed(r.Header.Get("Origin"), r.Host) {
		return nil, errOriginNotAllowed
	}
	for k, vs := range opts.ResponseHeader {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	conn, err := coderws.Accept(w, r, &coderws.AcceptOptions{
		Subprotocols: opts.Subprotocols,
		// The origin was checked above against Dropline's allow-list of
		// "scheme://host[:port]" origins, the same list CORS uses; coder's
		// own check only knows host patterns.
		InsecureSkipVerify: true,
		CompressionMode:    coderws.CompressionDisabled,
	})
	if err != nil {
		return nil, fmt.Errorf("accepting websocket: %w", err)
	}
	ws := &wsConn{conn: conn, state: streamConnFrom(r.Context()), writeTimeout: i.writeTimeout}
	if ws.state != nil {
		ws.state.mu.Lock()
		ws.state.ws = ws
		ws.state.mu.Unlock()
	}
	return ws, nil
}

// wsConn adapts a coder/websocket connection to gqlgen's WebsocketConn.
type wsConn struct {
	conn         *coderws.Conn
	state        *streamConn
	writeTimeout time.Duration

	mu            sync.Mutex
	deadlineTimer *time.Timer
	closing       bool
}

// NextReader waits as long as it takes for a client's next message (a
// subscriber may say nothing for hours), but once a message has begun, all
// of it must arrive within the write timeout: a client trickling bytes is
// cut off rather than holding its connection for ever.
func (c *wsConn) NextReader() (int, io.Reader, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	typ, r, err := c.conn.Reader(ctx)
	if err != nil {
		switch coderws.CloseStatus(err) {
		case coderws.StatusNormalClosure, coderws.StatusNoStatusRcvd:
			return int(typ), nil, transport.ErrWebsocketClosed
		}
		return int(typ), nil, err
	}
	timer := time.AfterFunc(c.writeTimeout, cancel) // cancelling closes the connection
	data, err := io.ReadAll(r)
	timer.Stop()
	if err != nil {
		return int(typ), nil, err
	}
	return int(typ), bytes.NewReader(data), nil
}

// WriteJSON writes one message within the write timeout; coder/websocket
// closes the connection when the deadline passes.
func (c *wsConn) WriteJSON(v any) error {
	data, ok := encodeDataMessage(v)
	if !ok {
		var err error
		if data, err = json.Marshal(v); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.writeTimeout)
	defer cancel()
	return c.conn.Write(ctx, coderws.MessageText, data)
}

// WriteClose starts the close handshake in the background (it waits up to
// 5 s for the peer), as gqlgen's adapter does. gqlgen closes a connection
// whose context ended with 1000; when that was the token expiring, the
// client is told 4403 instead.
func (c *wsConn) WriteClose(code int, reason string) error {
	c.mu.Lock()
	c.stopDeadlineLocked()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	c.mu.Unlock()
	if code == transport.WebsocketCloseNormalClosure && c.state.tokenExpired() {
		code, reason = CloseForbidden, "Forbidden: token expired"
	}
	go func() { _ = c.conn.Close(coderws.StatusCode(code), reason) }()
	return nil
}

func (c *wsConn) Close() error {
	c.mu.Lock()
	c.stopDeadlineLocked()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		return nil // the close handshake owns the connection
	}
	return c.conn.CloseNow()
}

func (c *wsConn) Subprotocol() string { return c.conn.Subprotocol() }

func (c *wsConn) SetReadLimit(n int64) { c.conn.SetReadLimit(n) }

// SetReadDeadline is how gqlgen enforces pongs; coder/websocket has no read
// deadline, so the connection is closed when the time passes.
func (c *wsConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopDeadlineLocked()
	if t.IsZero() {
		return nil
	}
	c.deadlineTimer = time.AfterFunc(time.Until(t), func() { _ = c.conn.CloseNow() })
	return nil
}

func (c *wsConn) stopDeadlineLocked() {
	if c.deadlineTimer != nil {
		c.deadlineTimer.Stop()
		c.deadlineTimer = nil
	}
}

// messageLayout is where a gqlgen protocol message keeps its fields; ok is
// false for a type of another shape.
type messageLayout struct {
	payload, id, typ int
	ok               bool
}

var messageLayouts sync.Map // reflect.Type -> messageLayout

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// encodeDataMessage encodes a subscription's data message ("next", or
// "data" in the legacy protocol) of either of gqlgen's websocket protocols,
// whose exported fields are Payload json.RawMessage `json:"payload,omitempty"`,
// ID string `json:"id,omitempty"` and Type `json:"type"`, in that order. The
// payload is gqlgen's json.Marshal of the response, compact and escaped
// already, so the bytes are json.Marshal's without a second pass over the
// payload, once per subscriber of every update. Any other message, or a
// type of another shape, is left to json.Marshal (ok false).
func encodeDataMessage(v any) ([]byte, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	rv = rv.Elem()
	l := layoutOf(rv.Type())
	if !l.ok {
		return nil, false
	}
	typ := rv.Field(l.typ).String()
	payload := rv.Field(l.payload).Bytes()
	if (typ != "next" && typ != "data") || len(payload) == 0 {
		return nil, false
	}
	id, err := json.Marshal(rv.Field(l.id).String())
	if err != nil {
		return nil, false
	}
	b := make([]byte, 0, len(payload)+len(id)+len(typ)+32)
	b = append(b, `{"payload":`...)
	b = append(b, payload...)
	if len(id) > 2 {
		b = append(b, `,"id":`...)
		b = append(b, id...)
	}
	b = append(b, `,"type":"`...)
	b = append(b, typ...)
	b = append(b, `"}`...)
	return b, true
}

func layoutOf(t reflect.Type) messageLayout {
	if l, ok := messageLayouts.Load(t); ok {
		return l.(messageLayout)
	}
	var l messageLayout
	var exported []int
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			exported = append(exported, i)
		}
	}
	if len(exported) == 3 {
		p, id, ty := t.Field(exported[0]), t.Field(exported[1]), t.Field(exported[2])
		l = messageLayout{payload: exported[0], id: exported[1], typ: exported[2],
			ok: p.Type == rawMessageType && p.Tag.Get("json") == "payload,omitempty" &&
				id.Type.Kind() == reflect.String && id.Tag.Get("json") == "id,omitempty" &&
				ty.Type.Kind() == reflect.String && ty.Tag.Get("json") == "type"}
	}
	messageLayouts.Store(t, l)
	return l
}
