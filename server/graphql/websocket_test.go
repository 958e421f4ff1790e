package graphql_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// wsStep is one message a client sends and how many messages it then
// expects; a script whose server closes ends with the close code and
// reason.
type wsStep struct {
	send   string
	expect int
}

// TestWebsocketAnswersLikeGqlgen plays the same conversations, on both
// protocols, against Dropline's websocket transport and gqlgen's own (same
// schema, limits and authentication) and requires the same messages, byte
// for byte, and the same close codes and reasons.
func TestWebsocketAnswersLikeGqlgen(t *testing.T) {
	t.Parallel()
	var cfg graphql.Config
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { cfg = *c })
	cfg.Registerer = nil
	theirs := httptest.NewServer(graphql.NewHandlerGqlgenWebsocket(cfg))
	t.Cleanup(theirs.Close)
	theirsURL := "ws" + strings.TrimPrefix(theirs.URL, "http")
	e.CreateProduct(t, map[string]any{"sku": "CONF-1", "stock": 5})

	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		legacy := proto == wsclient.LegacyWS
		start, stop, ack := "subscribe", "complete", 1
		if legacy {
			start, stop, ack = "start", "stop", 2 // connection_ack, then ka
		}
		op := func(id, payload string) string {
			return fmt.Sprintf(`{"id":%q,"type":%q,"payload":%s}`, id, start, payload)
		}
		sub := op("a", `{"query":"subscription($s: [ID!]!) { stockChanged(skus: $s) { sku available held sold total } }","variables":{"s":["CONF-1"]}}`)
		init := `{"type":"connection_init"}`
		scripts := map[string][]wsStep{
			"a conversation": {
				{init, ack},
				{sub, 1},
				{op("q", `{"query":"{ __typename }"}`), 2},
				{op("syntax", `{"query":"subscription {"}`), 2},
				{op("invalid", `{"query":"subscription { nope }"}`), 2},
				{op("undecodable", `"not params"`), 2},
				{op("vars", `{"query":"subscription($s: [ID!]!) { stockChanged(skus: $s) { sku } }","variables":{"s":3}}`), 2},
				{fmt.Sprintf(`{"id":"a","type":%q}`, stop), 1},
				{fmt.Sprintf(`{"id":"unknown","type":%q}`, stop), 0},
			},
			"not JSON first":        {{"not json", 0}},
			"subscription first":    {{sub, 0}},
			"an unknown type first": {{`{"type":"bogus"}`, 0}},
			"a server type first":   {{`{"type":"next"}`, 0}},
			"a bad token":           {{`{"type":"connection_init","payload":{"Authorization":"Bearer nope"}}`, 0}},
			"an unknown type later": {{init, ack}, {`{"type":"bogus"}`, 0}},
			"init twice":            {{init, ack}, {init, 0}},
			"a server type later":   {{init, ack}, {`{"type":"connection_ack"}`, 0}},
		}
		if legacy {
			scripts["terminate"] = []wsStep{{init, ack}, {`{"type":"connection_terminate"}`, 0}}
		} else {
			scripts["a conversation"] = append(scripts["a conversation"],
				wsStep{`{"type":"ping","payload":{"k": [1, 2]}}`, 1}, wsStep{`{"type":"ping"}`, 1}, wsStep{`{"type":"pong"}`, 0})
		}
		// gqlgen returns from a connection whose init payload is not an
		// object and leaves it open; Dropline always closed it then.
		t.Run(proto+"/an init payload that is no object", func(t *testing.T) {
			t.Parallel()
			require.Equal(t, []string{"dropped"}, converse(t, e.wsURL, proto, []wsStep{{`{"type":"connection_init","payload":"x"}`, 0}}, closeWait))
		})
		for name, script := range scripts {
			t.Run(proto+"/"+name, func(t *testing.T) {
				t.Parallel()
				wait := closeWait
				if name == "a conversation" {
					wait = openWait
				}
				want := converse(t, theirsURL, proto, script, wait)
				got := converse(t, e.wsURL, proto, script, wait)
				require.Equal(t, want, got)
			})
		}
	}
}

// How long converse waits for a script's end: a server's close can take a
// while on a loaded machine, while a conversation that goes on is told from
// one that ends by nothing coming within a moment (a longer wait would
// take the legacy protocol's keep-alive for an answer).
const (
	closeWait = 5 * time.Second
	openWait  = 300 * time.Millisecond
)

// converse plays script and returns what the server sent: each message as
// bytes, then how the connection ended, waited for up to wait.
func converse(t *testing.T, url, proto string, script []wsStep, wait time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer c.CloseNow()
	var got []string
	for _, s := range script {
		require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(s.send)))
		for range s.expect {
			_, b, err := c.Read(ctx)
			require.NoError(t, err, "after %s: %v", s.send, got)
			got = append(got, string(b))
		}
	}
	// The end: the server's close, or, for a conversation that goes on,
	// nothing more within a moment.
	readCtx, stopRead := context.WithTimeout(ctx, wait)
	defer stopRead()
	_, b, err := c.Read(readCtx)
	var ce websocket.CloseError
	switch {
	case err == nil:
		got = append(got, "unexpected: "+string(b))
	case errors.As(err, &ce):
		got = append(got, fmt.Sprintf("close %d %q", ce.Code, ce.Reason))
	case readCtx.Err() != nil:
		got = append(got, "open")
	default:
		got = append(got, "dropped")
	}
	return got
}

// TestOversizedMessagesCloseWith1009: a message over MessageBytes closes
// the connection with 1009 every time, at connection_init or later. The
// server reads what the client sent until the client's close, so no unread
// data turns the close into a reset that would lose the code.
func TestOversizedMessagesCloseWith1009(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { c.Streams.MessageBytes = 2048 })
	big := `{"type":"connection_init","payload":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}`
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, resp, err := websocket.Dial(ctx, e.wsURL, &websocket.DialOptions{Subprotocols: []string{wsclient.TransportWS}})
		require.NoError(t, err)
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
		if i%2 == 1 {
			require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(`{"type":"connection_init"}`)))
			_, ack, err := c.Read(ctx)
			require.NoError(t, err)
			require.JSONEq(t, `{"type":"connection_ack"}`, string(ack))
		}
		require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(big)))
		_, _, err = c.Read(ctx)
		require.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err), "connection %d: %v", i, err)
		_ = c.CloseNow()
		cancel()
	}
}

// TestReusedSubscriptionIDsAreAllEndedWithTheConnection: a client that
// starts a second subscription under an id still in use can no longer
// stop the first, but closing the connection ends both.
func TestReusedSubscriptionIDsAreAllEndedWithTheConnection(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{})
	e.CreateProduct(t, map[string]any{"sku": "REUSE-1", "stock": 5})
	c := dialRaw(t, e.wsURL, wsclient.TransportWS)
	c.subscribe(t, "REUSE-1")
	c.subscribe(t, "REUSE-1")
	active := func() float64 {
		return testutil.ToFloat64(mustGauge(t, e.reg, "dropline_graphql_subscriptions_active", "stockChanged"))
	}
	require.Equal(t, 2.0, active())
	require.NoError(t, c.conn.Close())
	require.Eventually(t, func() bool { return active() == 0 }, 5*time.Second, 10*time.Millisecond,
		"a subscription outlived its connection")
}

// TestFragmentedMessageMustEndWithinWriteTimeout: once a message has begun,
// the whole message, all its frames, must arrive within WriteTimeout. A
// client that sends a frame of the message now and then, each well within
// WriteTimeout of the one before, is cut off all the same.
func TestFragmentedMessageMustEndWithinWriteTimeout(t *testing.T) {
	t.Parallel()
	const writeTimeout = 300 * time.Millisecond
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { c.Streams.WriteTimeout = writeTimeout })
	c := dialRaw(t, e.wsURL, wsclient.LegacyWS)
	mask := []byte{1, 2, 3, 4}
	// The message's first frame: text, not final, one byte.
	_, err := c.conn.Write(append([]byte{0x01, 0x80 | 1}, append(mask, '{'^mask[0])...))
	require.NoError(t, err)
	// Then an empty continuation frame every third of WriteTimeout, for
	// four times WriteTimeout; the server may close the socket meanwhile.
	for range 12 {
		time.Sleep(writeTimeout / 3)
		if _, err := c.conn.Write(append([]byte{0x00, 0x80}, mask...)); err != nil {
			break
		}
	}
	// The server has dropped the connection by now: reading ends with it at
	// once (keep-alives may come first), not with this read's own deadline,
	// which is shorter than WriteTimeout after the last frame.
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(writeTimeout/3)))
	_, err = io.Copy(io.Discard, c.br)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(),
		"a message trickled frame by frame was still being read after %s: %v", 4*writeTimeout, err)
}

// TestContinuationPastEveryLengthClosesWith1009: a message begun with a
// small frame, then continued by a frame that declares the largest length
// a frame can (2^63-1), is over the limit however it is added up: the
// server closes with 1009 rather than adding the lengths past int64 and
// trying to allocate the sum.
func TestContinuationPastEveryLengthClosesWith1009(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{})
	c := dialRaw(t, e.wsURL, wsclient.TransportWS)
	mask := []byte{1, 2, 3, 4}
	first := append([]byte{0x01, 0x80 | 1}, append(mask, '{'^mask[0])...) // text, not final
	next := []byte{0x80, 0x80 | 127, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	_, err := c.conn.Write(append(append(first, next...), mask...))
	require.NoError(t, err)
	code, err := c.readClose()
	require.NoError(t, err, "the server dropped the connection without a close frame")
	require.Equal(t, 1009, code)
}

// readClose reads the server's frames up to its close frame and returns
// the close code.
func (c *rawWSClient) readClose() (int, error) {
	for {
		h := make([]byte, 2)
		if _, err := io.ReadFull(c.br, h); err != nil {
			return 0, err
		}
		n := int64(h[1] & 0x7f)
		switch n {
		case 126, 127:
			ext := make([]byte, 2+6*(n-126))
			if _, err := io.ReadFull(c.br, ext); err != nil {
				return 0, err
			}
			n = 0
			for _, b := range ext {
				n = n<<8 | int64(b)
			}
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(c.br, p); err != nil {
			return 0, err
		}
		if h[0]&0x0f == 0x8 {
			if len(p) < 2 {
				return 1005, nil
			}
			return int(p[0])<<8 | int(p[1]), nil
		}
	}
}

// TestWebsocketReadsCoderClientFrames: coder/websocket's client, as the
// reference peer, talks to the transport in frames a GraphQL client
// library seldom sends: connection_init and a subscription split over
// several frames (one of them empty) with a ping between two of them, a
// binary message, and its close, which the server answers with the same
// code.
func TestWebsocketReadsCoderClientFrames(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{})
	e.CreateProduct(t, map[string]any{"sku": "FRAMES-1", "stock": 5})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, e.wsURL, &websocket.DialOptions{Subprotocols: []string{wsclient.TransportWS}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer c.CloseNow()
	msgs := make(chan string, 8)
	go func() { // coder/websocket reads pongs only while a Read runs
		defer close(msgs)
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				msgs <- fmt.Sprintf("end %d", websocket.CloseStatus(err))
				return
			}
			msgs <- string(b)
		}
	}()
	read := func() string {
		select {
		case m := <-msgs:
			return m
		case <-ctx.Done():
			return "nothing"
		}
	}
	sendFragmented := func(typ websocket.MessageType, parts ...string) {
		w, err := c.Writer(ctx, typ)
		require.NoError(t, err)
		for i, p := range parts {
			_, err := w.Write([]byte(p))
			require.NoError(t, err)
			if i == 0 {
				require.NoError(t, c.Ping(ctx), "a ping between two frames of a message")
			}
		}
		require.NoError(t, w.Close())
	}
	sendFragmented(websocket.MessageText, `{"type":`, ``, `"connection_init"}`)
	require.Equal(t, `{"type":"connection_ack"}`, read())
	sendFragmented(websocket.MessageText, `{"id":"1","type":"subscribe","payload":{"query":"subscription($s: [ID!]!) `,
		`{ stockChanged(skus: $s) { sku available } }",`, `"variables":{"s":["FRAMES-1"]}}}`)
	require.JSONEq(t, `{"id":"1","type":"next","payload":{"data":{"stockChanged":{"sku":"FRAMES-1","available":5}}}}`, read())
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, []byte(`{"id":"2","type":"subscribe","payload":{"query":"{ __typename }"}}`)))
	require.JSONEq(t, `{"id":"2","type":"next","payload":{"data":{"__typename":"Query"},"extensions":{"cost":{"requestedQueryCost":1,`+
		`"actualQueryCost":0,"throttleStatus":{"maximumAvailable":10000,"currentlyAvailable":10000,"restoreRate":1000}}}}}`, read())
	require.JSONEq(t, `{"id":"2","type":"complete"}`, read())
	require.NoError(t, c.Close(4000, "done"), "the server answers a close with its code")
}
