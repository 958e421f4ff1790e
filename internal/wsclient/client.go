// Package wsclient is a small GraphQL-over-websocket client for Dropline's
// tests: it speaks graphql-transport-ws (the graphql-ws library's protocol)
// and the legacy graphql-ws subprotocol, answers pings, and timestamps every
// message on arrival. It is not a production client: no reconnects, no
// lazy connection.
package wsclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Subprotocols.
const (
	TransportWS = "graphql-transport-ws"
	LegacyWS    = "graphql-ws"
)

// Options configure Dial.
type Options struct {
	// Subprotocol is TransportWS (default) or LegacyWS.
	Subprotocol string
	// InitPayload is sent with connection_init (e.g. {"Authorization":
	// "Bearer …"}); nil sends none.
	InitPayload map[string]any
	// Header is sent with the upgrade request (Authorization, Origin).
	Header http.Header
	// HTTPClient dials the connection; nil uses http.DefaultClient.
	HTTPClient *http.Client
	// Buffer is each subscription's message buffer; default 256. The
	// reader waits when it is full, as a slow application would.
	Buffer int
}

// Message is one payload of a subscription.
type Message struct {
	// Data and Errors are the GraphQL response; Errors is set for an
	// "error" message too.
	Data   json.RawMessage `json:"data"`
	Errors []GraphQLError  `json:"errors"`
	// At is when the message was read off the connection.
	At time.Time `json:"-"`
}

// GraphQLError is an entry of a response's errors.
type GraphQLError struct {
	Message    string         `json:"message"`
	Extensions map[string]any `json:"extensions"`
}

// Code returns extensions.code.
func (e GraphQLError) Code() string { s, _ := e.Extensions["code"].(string); return s }

// Client is one connection.
type Client struct {
	conn  *websocket.Conn
	proto string
	buf   int

	mu     sync.Mutex
	subs   map[string]*Subscription
	nextID int
	err    error // why the reader stopped
	done   chan struct{}

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: the reader stops waiting on full buffers
}

// Subscription is one operation's stream. C carries its payloads and is
// closed after "complete", an "error" message (delivered on C first), or
// the connection's end.
type Subscription struct {
	ID string
	C  chan Message
	c  *Client
}

type frame struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Dial connects to url (ws:// or wss://), sends connection_init and waits
// for the acknowledgement. A refusal returns an error from which
// websocket.CloseStatus extracts the server's close code.
func Dial(ctx context.Context, url string, opts Options) (*Client, error) {
	proto := opts.Subprotocol
	if proto == "" {
		proto = TransportWS
	}
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{proto},
		HTTPHeader:   opts.Header,
		HTTPClient:   opts.HTTPClient,
	})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close() // coder/websocket has read what it needs
	}
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", url, err)
	}
	conn.SetReadLimit(1 << 20)
	c := &Client{conn: conn, proto: proto, buf: opts.Buffer, subs: map[string]*Subscription{}, done: make(chan struct{}), closing: make(chan struct{})}
	if c.buf <= 0 {
		c.buf = 256
	}
	init := frame{Type: "connection_init"}
	if opts.InitPayload != nil {
		init.Payload, _ = json.Marshal(opts.InitPayload)
	}
	if err := c.write(ctx, init); err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	for {
		var f frame
		if err := c.read(ctx, &f); err != nil {
			_ = conn.CloseNow()
			return nil, fmt.Errorf("waiting for connection_ack: %w", err)
		}
		switch f.Type {
		case "connection_ack":
			go c.run() //nolint:gosec,contextcheck // the reader lives until Close, not until the dial's context ends
			return c, nil
		case "ka", "ping", "pong":
			if f.Type == "ping" {
				_ = c.write(ctx, frame{Type: "pong"})
			}
		case "connection_error":
			// Legacy protocol: the close frame follows; report it.
			var f2 frame
			err := c.read(ctx, &f2)
			_ = conn.CloseNow()
			return nil, fmt.Errorf("connection_error %s: %w", f.Payload, err)
		default:
			_ = conn.CloseNow()
			return nil, fmt.Errorf("unexpected %q before connection_ack", f.Type)
		}
	}
}

func (c *Client) write(ctx context.Context, f frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return c.conn.Write(ctx, websocket.MessageText, b)
}

func (c *Client) read(ctx context.Context, f *frame) error {
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, f)
}

func (c *Client) run() {
	ctx := context.Background()
	var err error
	defer func() {
		c.mu.Lock()
		c.err = err
		subs := c.subs
		c.subs = map[string]*Subscription{}
		c.mu.Unlock()
		for _, s := range subs {
			close(s.C)
		}
		close(c.done)
	}()
	for {
		var f frame
		if err = c.read(ctx, &f); err != nil {
			return
		}
		at := time.Now()
		switch f.Type {
		case "ping":
			if err = c.write(ctx, frame{Type: "pong"}); err != nil {
				return
			}
		case "next", "data":
			var m Message
			if err = json.Unmarshal(f.Payload, &m); err != nil {
				return
			}
			m.At = at
			if s := c.sub(f.ID, false); s != nil {
				select {
				case s.C <- m:
				case <-c.closing:
					err = errors.New("client closed")
					return
				}
			}
		case "error":
			m := Message{At: at}
			if json.Unmarshal(f.Payload, &m.Errors) != nil {
				// legacy graphql-ws sends one error object
				var e GraphQLError
				_ = json.Unmarshal(f.Payload, &e)
				m.Errors = []GraphQLError{e}
			}
			if s := c.sub(f.ID, true); s != nil {
				select {
				case s.C <- m:
				case <-c.closing:
				}
				close(s.C)
			}
		case "complete":
			if s := c.sub(f.ID, true); s != nil {
				close(s.C)
			}
		}
	}
}

func (c *Client) sub(id string, remove bool) *Subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.subs[id]
	if remove {
		delete(c.subs, id)
	}
	return s
}

// Subscribe starts an operation.
func (c *Client) Subscribe(ctx context.Context, query string, vars map[string]any) (*Subscription, error) {
	c.mu.Lock()
	if c.err != nil || closed(c.done) {
		c.mu.Unlock()
		return nil, fmt.Errorf("connection ended: %w", c.err)
	}
	c.nextID++
	s := &Subscription{ID: strconv.Itoa(c.nextID), C: make(chan Message, c.buf), c: c}
	c.subs[s.ID] = s
	c.mu.Unlock()
	payload, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	typ := "subscribe"
	if c.proto == LegacyWS {
		typ = "start"
	}
	if err := c.write(ctx, frame{ID: s.ID, Type: typ, Payload: payload}); err != nil {
		c.sub(s.ID, true)
		return nil, err
	}
	return s, nil
}

// Stop ends a subscription from the client's side.
func (s *Subscription) Stop(ctx context.Context) error {
	typ := "complete"
	if s.c.proto == LegacyWS {
		typ = "stop"
	}
	return s.c.write(ctx, frame{ID: s.ID, Type: typ})
}

// Next returns the next message; ok is false once the stream has ended.
func (s *Subscription) Next(ctx context.Context) (m Message, ok bool, err error) {
	select {
	case m, ok = <-s.C:
		return m, ok, nil
	case <-ctx.Done():
		return Message{}, false, ctx.Err()
	}
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (use websocket.CloseStatus for the code).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection normally and waits for the reader. Closing
// a connection the server already closed is not an error.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	_ = c.conn.Close(websocket.StatusNormalClosure, "")
	<-c.done
	return nil
}

// CloseNow drops the connection without a close handshake and waits for
// the reader.
func (c *Client) CloseNow() error {
	c.closeOnce.Do(func() { close(c.closing) })
	_ = c.conn.CloseNow()
	<-c.done
	return nil
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
