package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
)

// Slowloris websockets against the real binary, with its default
// StreamLimits (see abuse_ws_test.go): peers that never send
// connection_init, that trickle a message, or that send one over the
// limit, speaking raw frames where a client library would not let them.

// TestWSSlowloris opens connections that never send connection_init, that
// trickle connection_init a byte at a time, and that send messages over the
// limit (whole, at the limit's edge, fragmented, or announced by a frame
// header), while a healthy subscriber watches a SKU whose stock changes
// without pause. Each attacker is cut off in time with the right close
// code; the healthy subscriber converges on every change within budget.
func TestWSSlowloris(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	p := s.start("a")
	const sku = "WSSLOW-1"
	s.createProduct(p, sku, 50, 0)
	initial := s.stockOf(sku)
	url := wsEndpoint(p)
	addr := strings.TrimPrefix(p.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vars := map[string]any{"s": []string{sku}}

	normal, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: loopbackClient(t, "127.0.0.1")})
	require.NoError(t, err)
	defer normal.Close()
	sub, err := normal.Subscribe(ctx, wsStockDoc, vars)
	require.NoError(t, err)
	healthy := watchStock(sub)
	_, err = healthy.waitFor(initial, 10*time.Second)
	require.NoError(t, err)

	const attackerIP = "127.0.0.21"
	attackClient := loopbackClient(t, attackerIP)
	type attack struct {
		name string
		// wantCode is the close code; closeWithin bounds when it comes
		// (from the attack's start), closeAfter is its earliest.
		wantCode    int
		closeAfter  time.Duration
		closeWithin time.Duration
		// endWithin, when set, bounds when the server drops the TCP
		// connection of a peer that never answers the close frame.
		endWithin time.Duration
		run       func(ctx context.Context) wsOutcome
	}
	initEarliest, initLatest := wsInitTimeout-300*time.Millisecond, wsInitTimeout+2*time.Second
	// A peer that ignores the close frame is dropped when the close
	// handshake times out (coder/websocket waits 5 s for the peer).
	rawEnd := wsInitTimeout + 5*time.Second + 3*time.Second
	attacks := []attack{}
	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		attacks = append(attacks,
			attack{name: proto + ": upgraded, never sends connection_init", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest,
				run: func(ctx context.Context) wsOutcome { return silentClient(ctx, url, proto, attackClient) }},
			attack{name: proto + ": raw upgrade, never sends a byte, ignores the close frame", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest, endWithin: rawEnd,
				run: func(ctx context.Context) wsOutcome { return rawTrickle(ctx, attackerIP, addr, proto, nil) }},
			attack{name: proto + ": raw upgrade, trickles connection_init a byte every 200 ms", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest, endWithin: rawEnd,
				run: func(ctx context.Context) wsOutcome {
					init := wsFrame(0x1, true, []byte(`{"type":"connection_init","payload":{"pad":"`+strings.Repeat("x", 200)+`"}}`))
					return rawTrickle(ctx, attackerIP, addr, proto, init)
				}},
			attack{name: proto + ": 64 KiB + 1 before connection_init", wantCode: closeMessageTooBig, closeWithin: 2 * time.Second,
				run: func(ctx context.Context) wsOutcome { return oversizeClient(ctx, url, proto, attackClient, false) }},
			attack{name: proto + ": a 64 KiB subscribe (served), then 64 KiB + 1", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return oversizeClient(ctx, url, proto, attackClient, true) }},
			attack{name: proto + ": 80 KB in two fragments after connection_init", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return rawOversize(ctx, attackerIP, addr, proto, false) }},
			attack{name: proto + ": a frame announcing 1 GiB after connection_init", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return rawOversize(ctx, attackerIP, addr, proto, true) }},
		)
	}

	results := make([]wsOutcome, len(attacks))
	var wg sync.WaitGroup
	attackStart := time.Now()
	for i, a := range attacks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, acancel := context.WithTimeout(ctx, 20*time.Second)
			defer acancel()
			results[i] = a.run(actx)
		}()
	}
	attacking := make(chan struct{})
	go func() { wg.Wait(); close(attacking) }()

	// The stock changes without pause while the attackers run; after each
	// change the healthy subscriber must converge within the budget.
	stepper := newStockStepper(s, p, sku, initial, 5)
	var lat latencies
	for stepper.steps < 400 && !isClosed(attacking) {
		want, answered := stepper.step(ctx, t)
		at, err := healthy.waitFor(want, 5*time.Second)
		require.NoError(t, err, "step %d", stepper.steps)
		lat.add(at.Sub(answered))
	}
	<-attacking
	attackTime := time.Since(attackStart)
	stepper.release(ctx, t)
	_, err = healthy.waitFor(initial, 5*time.Second)
	require.NoError(t, err)
	require.Empty(t, healthy.problems())
	require.False(t, isClosed(normal.Done()), "the healthy connection survived")

	for i, a := range attacks {
		o := results[i]
		t.Logf("%s: %s", a.name, o)
		require.NoError(t, o.err, a.name)
		require.Equal(t, a.wantCode, o.code, "%s: close code (reason %q)", a.name, o.reason)
		require.GreaterOrEqual(t, o.closeAt, a.closeAfter, "%s: closed too early", a.name)
		require.LessOrEqual(t, o.closeAt, a.closeWithin, "%s: closed too late", a.name)
		if a.endWithin > 0 {
			require.True(t, o.ended, "%s: the TCP connection was never dropped", a.name)
			require.LessOrEqual(t, o.endAt, a.endWithin, "%s: dropped too late", a.name)
		}
	}
	require.GreaterOrEqual(t, stepper.steps, 10, "enough changes to judge the latency")
	require.Less(t, lat.max(), wsLatencyBudget, "G8 during the slowloris: %s", lat)

	requireStockUntouched(t, s, sku, initial)
	t.Logf("FIGURES websocket slowloris: attackers=%d cut_off=%d (all with the expected code) for %s; changes=%d healthy_latency %s violations=0",
		len(attacks), len(attacks), attackTime.Round(100*time.Millisecond), stepper.steps, lat)
}

// TestWSTrickleAfterInit trickles a subscribe message after connection_ack,
// a byte a second. Once a message has begun, all of it must arrive within
// the write timeout (DROPLINE_STREAM_WRITE_TIMEOUT; 3 s here, rather than
// the default 10 s the test would wait out), whatever the protocol: a peer
// trickling bytes is cut off, not before the timeout, while an idle
// subscriber (which sends nothing at all) is not.
func TestWSTrickleAfterInit(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	const messageTimeout = 3 * time.Second
	s.Env["DROPLINE_STREAM_WRITE_TIMEOUT"] = messageTimeout.String()
	p := s.start("a")
	addr := strings.TrimPrefix(p.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var legacy, modern wsOutcome
	sub := func(typ string) []byte {
		return wsFrame(0x1, true, []byte(`{"id":"1","type":"`+typ+`","payload":{"query":"`+strings.Repeat(" ", 400)+`subscription { stockChanged(skus: [\"X\"]) { sku } }"}}`))
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		modern = rawAfterInit(ctx, "127.0.0.31", addr, wsclient.TransportWS, sub("subscribe"), messageTimeout+15*time.Second)
	}()
	go func() {
		defer wg.Done()
		legacy = rawAfterInit(ctx, "127.0.0.31", addr, wsclient.LegacyWS, sub("start"), messageTimeout+15*time.Second)
	}()
	wg.Wait()
	t.Logf("graphql-transport-ws: %s", modern)
	t.Logf("graphql-ws: %s", legacy)
	for name, o := range map[string]wsOutcome{"graphql-transport-ws": modern, "graphql-ws": legacy} {
		require.NoError(t, o.err, name)
		require.True(t, o.ended, "%s: a peer trickling a message is cut off", name)
		require.GreaterOrEqual(t, o.endAt, messageTimeout-time.Second, "%s: cut off too early", name)
		require.Less(t, o.endAt, messageTimeout+10*time.Second, "%s: cut off too late", name)
	}
}

// wsOutcome is how the server ended an attacking connection: the close
// frame's code and reason and when it came, and when the TCP connection
// ended (ended false: it did not within the attack's time).
type wsOutcome struct {
	code    int
	reason  string
	closeAt time.Duration
	ended   bool
	endAt   time.Duration
	err     error // the attack could not be carried out
}

func (o wsOutcome) String() string {
	s := fmt.Sprintf("close %d %q after %s", o.code, o.reason, o.closeAt.Round(10*time.Millisecond))
	if o.ended {
		s += fmt.Sprintf(", TCP dropped after %s", o.endAt.Round(10*time.Millisecond))
	}
	if o.err != nil {
		s += fmt.Sprintf(", error: %v", o.err)
	}
	return s
}

// fromCloseError fills the outcome from a coder/websocket read error.
func fromCloseError(err error, start time.Time) wsOutcome {
	o := wsOutcome{closeAt: time.Since(start)}
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		o.err = fmt.Errorf("no close frame: %w", err)
		return o
	}
	o.code, o.reason = int(ce.Code), ce.Reason
	return o
}

// silentClient upgrades and then only reads.
func silentClient(ctx context.Context, url, proto string, client *http.Client) wsOutcome {
	start := time.Now()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: client})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close() // coder/websocket has read what it needs
	}
	if err != nil {
		return wsOutcome{err: err}
	}
	defer conn.CloseNow()
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return fromCloseError(err, start)
		}
	}
}

// oversizeClient sends one message of wsMessageBytes+1. With afterInit it
// first completes connection_init and subscribes with a message of exactly
// wsMessageBytes, which must be served.
func oversizeClient(ctx context.Context, url, proto string, client *http.Client, afterInit bool) wsOutcome {
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: client})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close() // coder/websocket has read what it needs
	}
	if err != nil {
		return wsOutcome{err: err}
	}
	defer conn.CloseNow()
	read := func() (map[string]any, error) {
		for {
			_, b, err := conn.Read(ctx)
			if err != nil {
				return nil, err
			}
			var f map[string]any
			if err := json.Unmarshal(b, &f); err != nil {
				return nil, err
			}
			if f["type"] != "ka" && f["type"] != "ping" {
				return f, nil
			}
		}
	}
	if afterInit {
		if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"connection_init"}`)); err != nil {
			return wsOutcome{err: err}
		}
		if f, err := read(); err != nil || f["type"] != "connection_ack" {
			return wsOutcome{err: fmt.Errorf("no connection_ack: %v: %w", f, err)}
		}
		typ := "subscribe"
		if proto == wsclient.LegacyWS {
			typ = "start"
		}
		msg := paddedJSON(`{"id":"1","type":"`+typ+`","payload":{"query":"subscription { stockChanged(skus: [\"WSSLOW-1\"]) { sku available } }"}`, wsMessageBytes)
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			return wsOutcome{err: err}
		}
		f, err := read()
		if err != nil || (f["type"] != "next" && f["type"] != "data") || !strings.Contains(fmt.Sprint(f["payload"]), "WSSLOW-1") {
			return wsOutcome{err: fmt.Errorf("a subscribe of exactly %d bytes was not served: %v: %w", wsMessageBytes, f, err)}
		}
	}
	start := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, paddedJSON(`{"type":"connection_init"`, wsMessageBytes+1)); err != nil {
		return wsOutcome{err: err}
	}
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return fromCloseError(err, start)
		}
	}
}

// paddedJSON closes the object opened by prefix with spaces and "}" so that
// the message is exactly n bytes.
func paddedJSON(prefix string, n int) []byte {
	b := make([]byte, 0, n)
	b = append(b, prefix...)
	for len(b) < n-1 {
		b = append(b, ' ')
	}
	return append(b, '}')
}

// rawUpgrade opens a TCP connection from ip and completes the websocket
// handshake by hand, so the test owns every byte that follows.
func rawUpgrade(ctx context.Context, ip, addr, proto string) (net.Conn, *bufio.Reader, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	req := "GET /graphql HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: " + proto + "\r\n\r\n"
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	_ = resp.Body.Close() // a 101 has no body: the connection is ours from here
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_ = c.Close()
		return nil, nil, fmt.Errorf("upgrade answered %d", resp.StatusCode)
	}
	_ = c.SetDeadline(time.Time{})
	return c, br, nil
}

// wsFrameHeader is a masked client frame's header (RFC 6455 §5.2) for a
// payload of n bytes, masked with wsMaskKey.
func wsFrameHeader(opcode byte, fin bool, n uint64) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	h := []byte{b0}
	switch {
	case n < 126:
		h = append(h, 0x80|byte(n))
	case n <= 0xffff:
		h = append(h, 0x80|126, byte(n>>8), byte(n))
	default:
		h = append(h, 0x80|127)
		for shift := 56; shift >= 0; shift -= 8 {
			h = append(h, byte(n>>shift))
		}
	}
	return append(h, wsMaskKey[:]...)
}

var wsMaskKey = [4]byte{0x1f, 0x2e, 0x3d, 0x4c}

// wsMask masks payload bytes that start at offset off of the payload.
func wsMask(payload []byte, off int) []byte {
	out := make([]byte, len(payload))
	for i, b := range payload {
		out[i] = b ^ wsMaskKey[(off+i)%4]
	}
	return out
}

// wsFrame is one whole masked client frame.
func wsFrame(opcode byte, fin bool, payload []byte) []byte {
	return append(wsFrameHeader(opcode, fin, uint64(len(payload))), wsMask(payload, 0)...)
}

// readServerFrame reads one (unmasked) server frame.
func readServerFrame(br *bufio.Reader) (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(b[0])<<8 | uint64(b[1])
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = 0
		for _, x := range b {
			n = n<<8 | uint64(x)
		}
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("a server frame of %d bytes", n)
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(br, payload)
	return h[0] & 0x0f, payload, err
}

// awaitClose reads server frames until the close frame, then until the
// server drops the connection or within has passed since start; it never
// answers the close frame, as a slowloris client would not.
func awaitClose(c net.Conn, br *bufio.Reader, start time.Time, within time.Duration) wsOutcome {
	_ = c.SetReadDeadline(start.Add(within))
	var o wsOutcome
	seen := false
	for {
		op, payload, err := readServerFrame(br)
		if err != nil {
			switch {
			case isTimeout(err) && !seen:
				o.err = fmt.Errorf("no close frame within %s", within)
			case isTimeout(err): // closed, not dropped within the time
			default:
				o.ended, o.endAt = true, time.Since(start)
				if !seen {
					o.err = fmt.Errorf("dropped without a close frame: %w", err)
				}
			}
			return o
		}
		if op == 0x8 && !seen {
			seen, o.closeAt = true, time.Since(start)
			if len(payload) >= 2 {
				o.code, o.reason = int(payload[0])<<8|int(payload[1]), string(payload[2:])
			}
		}
	}
}

// rawTrickle upgrades by hand and then sends trickle one byte every 200 ms
// (nothing when it is nil) until the server drops the connection.
func rawTrickle(ctx context.Context, ip, addr, proto string, trickle []byte) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	if len(trickle) > 0 {
		go func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for _, b := range trickle {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				select {
				case <-tick.C:
				case <-done:
					return
				}
			}
		}()
	}
	return awaitClose(c, br, start, 15*time.Second)
}

// rawOversize completes connection_init by hand, then sends 80,000 bytes in
// two fragments of 40,000 or, with announced, a frame header announcing
// 1 GiB followed by 80,000 bytes of it.
func rawOversize(ctx context.Context, ip, addr, proto string, announced bool) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	if _, err := c.Write(wsFrame(0x1, true, []byte(`{"type":"connection_init"}`))); err != nil {
		return wsOutcome{err: err}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, payload, err := readServerFrame(br); err != nil || !strings.Contains(string(payload), "connection_ack") {
		return wsOutcome{err: fmt.Errorf("no connection_ack: %q: %w", payload, err)}
	}
	start := time.Now()
	chunk := make([]byte, 40_000)
	for i := range chunk {
		chunk[i] = ' '
	}
	var out []byte
	if announced {
		out = append(wsFrameHeader(0x1, true, 1<<30), wsMask(chunk, 0)...)
		out = append(out, wsMask(chunk, len(chunk))...)
	} else {
		out = append(wsFrame(0x1, false, chunk), wsFrame(0x0, true, chunk)...)
	}
	go func() { _, _ = c.Write(out) }() // the server may stop reading: never block on it
	return awaitClose(c, br, start, 10*time.Second)
}

// rawAfterInit completes connection_init by hand and then trickles msg one
// byte a second, until the server drops the connection or within passes.
func rawAfterInit(ctx context.Context, ip, addr, proto string, msg []byte, within time.Duration) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	if _, err := c.Write(wsFrame(0x1, true, []byte(`{"type":"connection_init"}`))); err != nil {
		return wsOutcome{err: err}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, payload, err := readServerFrame(br); err != nil || !strings.Contains(string(payload), "connection_ack") {
		return wsOutcome{err: fmt.Errorf("no connection_ack: %q: %w", payload, err)}
	}
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for _, b := range msg {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-done:
				return
			}
		}
	}()
	// Pings (and the legacy protocol's keep-alives) are read and never
	// answered; a drop without a close frame is what a read deadline does.
	_ = c.SetReadDeadline(start.Add(within))
	for {
		if _, _, err := readServerFrame(br); err != nil {
			if isTimeout(err) {
				return wsOutcome{}
			}
			return wsOutcome{ended: true, endAt: time.Since(start)}
		}
	}
}
