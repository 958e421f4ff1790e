package flashsale

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Watcher transports.
const (
	TransportWS  = "ws"  // graphql-transport-ws over a websocket
	TransportSSE = "sse" // GraphQL over server-sent events (distinct connections mode)
)

// watchDoc is what every watcher subscribes to; all watchers of one SKU
// send the same document and variables, as the browsers of one product
// page do.
const watchDoc = `subscription Watch($skus: [ID!]!) { stockChanged(skus: $skus) { sku available held sold total } }`

// watchConn is one live subscriber on its own TCP connection. The client
// is our own, kept to one goroutine and one small read buffer, so that ten
// thousand of them cost the driver little next to the server it measures.
type watchConn struct {
	conn net.Conn
	br   *bufio.Reader
	sse  bool
	body io.Reader // SSE: the response body (chunked decoding)
	// msg holds the message readFrame returns, reused for the next one:
	// ten thousand watchers allocating per message would make the
	// driver's garbage collector part of the latency it measures.
	msg []byte
}

// dialWatch opens a connection from local (a loopback source address) to
// the endpoint and subscribes to sku's stockChanged; it returns once the
// subscription was sent (the first value arrives on the read loop).
func dialWatch(ctx context.Context, endpoint string, local net.IP, transport, sku string, timeout time.Duration) (*watchConn, error) {
	p, err := subscribePayload(watchDoc, map[string]any{"skus": []string{sku}})
	if err != nil {
		return nil, err
	}
	return dialSubscription(ctx, endpoint, local, transport, p, timeout)
}

// dialSubscription opens a connection from local to the endpoint and sends
// the subscription payload (a GraphQL request: query and variables).
func dialSubscription(ctx context.Context, endpoint string, local net.IP, transport string, payload []byte, timeout time.Duration) (*watchConn, error) {
	return dialSubscriptionAs(ctx, endpoint, local, transport, "", payload, timeout)
}

// dialSubscriptionAs is dialSubscription as the bearer of a token ("":
// anonymous), which a websocket carries in its connection_init.
func dialSubscriptionAs(ctx context.Context, endpoint string, local net.IP, transport, bearer string, payload []byte, timeout time.Duration) (*watchConn, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: local}}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	w := &watchConn{conn: conn, br: bufio.NewReaderSize(conn, 1024), sse: transport == TransportSSE}
	if w.sse {
		err = w.startSSE(u, payload)
	} else {
		err = w.startWS(u, payload, bearer)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return w, nil
}

func subscribePayload(doc string, vars map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"query": doc, "variables": vars})
}

func (w *watchConn) startWS(u *url.URL, p []byte, bearer string) error {
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key +
		"\r\nSec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n"
	if _, err := io.WriteString(w.conn, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(w.br, nil) //nolint:bodyclose // a 101 has no body; the connection is the websocket
	if err != nil {
		return fmt.Errorf("websocket upgrade: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return fmt.Errorf("websocket upgrade: HTTP %d", resp.StatusCode)
	}
	init := []byte(`{"type":"connection_init","payload":{}}`)
	if bearer != "" {
		init, _ = json.Marshal(map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + bearer}})
	}
	if err := w.writeText(init); err != nil {
		return err
	}
	for {
		op, msg, err := w.readFrame()
		if err != nil {
			return fmt.Errorf("waiting for connection_ack: %w", err)
		}
		if op != opText {
			continue
		}
		if t := msgType(msg); t == "connection_ack" {
			break
		} else if t != "ping" {
			return fmt.Errorf("waiting for connection_ack: got %.100s", msg)
		}
		if err := w.writeText([]byte(`{"type":"pong"}`)); err != nil {
			return err
		}
	}
	return w.writeText(append(append([]byte(`{"id":"1","type":"subscribe","payload":`), p...), '}'))
}

func (w *watchConn) startSSE(u *url.URL, p []byte) error {
	req := "POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(p)) + "\r\n\r\n"
	if _, err := w.conn.Write(append([]byte(req), p...)); err != nil {
		return err
	}
	resp, err := http.ReadResponse(w.br, nil) //nolint:bodyclose // the body is the stream, closed with the connection
	if err != nil {
		return fmt.Errorf("SSE request: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("SSE request: HTTP %d", resp.StatusCode)
	}
	w.body = resp.Body
	w.br = bufio.NewReaderSize(resp.Body, 512)
	return nil
}

// Websocket opcodes the client handles.
const (
	opCont  = 0
	opText  = 1
	opClose = 8
	opPing  = 9
	opPong  = 10
)

// readFrame reads one whole message (continuations joined; control frames
// answered or returned). The message is valid until the next call.
func (w *watchConn) readFrame() (byte, []byte, error) {
	msg := w.msg[:0]
	defer func() { w.msg = msg[:0] }()
	var first byte = 255
	for {
		var h [2]byte
		if _, err := io.ReadFull(w.br, h[:]); err != nil {
			return 0, nil, err
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0f
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(w.br, b[:]); err != nil {
				return 0, nil, err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(w.br, b[:]); err != nil {
				return 0, nil, err
			}
			n = binary.BigEndian.Uint64(b[:])
		}
		if h[1]&0x80 != 0 || n > 1<<20 {
			return 0, nil, errors.New("bad frame from server")
		}
		start := len(msg)
		msg = slices.Grow(msg, int(n))[:start+int(n)]
		data := msg[start:]
		if _, err := io.ReadFull(w.br, data); err != nil {
			return 0, nil, err
		}
		if op >= opClose {
			// A control frame is not part of the message it interrupts.
			data = slices.Clone(data)
			msg = msg[:start]
		}
		switch op {
		case opPing:
			if err := w.writeFrame(opPong, data); err != nil {
				return 0, nil, err
			}
			continue
		case opPong:
			continue
		case opClose:
			return opClose, data, nil
		}
		if op != opCont {
			first = op
		}
		if fin {
			return first, msg, nil
		}
	}
}

func (w *watchConn) writeText(p []byte) error { return w.writeFrame(opText, p) }

// writeFrame writes one masked frame, as a client must.
func (w *watchConn) writeFrame(op byte, p []byte) error {
	b := make([]byte, 0, len(p)+14)
	b = append(b, 0x80|op)
	switch {
	case len(p) < 126:
		b = append(b, 0x80|byte(len(p)))
	case len(p) <= 0xffff:
		b = append(b, 0x80|126, byte(len(p)>>8), byte(len(p)))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	b = append(b, mask[:]...)
	for i, c := range p {
		b = append(b, c^mask[i%4])
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := w.conn.Write(b)
	return err
}

// next returns the next stock value the server sent; io.EOF when the
// subscription ended (complete, close, or the stream's end), another error
// when the server said something unexpected.
func (w *watchConn) next() (Stock, error) {
	msg, err := w.nextMessage()
	if err != nil {
		return Stock{}, err
	}
	return parseStock(msg)
}

// nextMessage returns the next value the server sent, as the message that
// carries it (valid until the next call); errors as next's.
func (w *watchConn) nextMessage() ([]byte, error) {
	if w.sse {
		return w.nextSSE()
	}
	for {
		op, msg, err := w.readFrame()
		if err != nil {
			return nil, err
		}
		if op == opClose {
			return nil, fmt.Errorf("closed by the server: %w", closeError(msg))
		}
		if op != opText {
			continue
		}
		switch msgType(msg) {
		case "next":
			return msg, nil
		case "ping":
			if err := w.writeText([]byte(`{"type":"pong"}`)); err != nil {
				return nil, err
			}
		case "pong":
		case "complete":
			return nil, io.EOF
		default:
			return nil, fmt.Errorf("unexpected message %.200s", msg)
		}
	}
}

func closeError(msg []byte) error {
	if len(msg) < 2 {
		return io.EOF
	}
	return fmt.Errorf("close %d %s", binary.BigEndian.Uint16(msg), msg[2:])
}

func (w *watchConn) nextSSE() ([]byte, error) {
	event := ""
	for {
		line, err := w.br.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case bytes.HasPrefix(line, []byte("event:")):
			event = strings.TrimSpace(string(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			if event == "next" {
				return line[len("data:"):], nil
			}
		case len(line) == 0:
			if event == "complete" {
				return nil, io.EOF
			}
			event = ""
		}
	}
}

func (w *watchConn) close() { _ = w.conn.Close() }

// msgType reads a graphql-transport-ws message's type without decoding the
// whole message.
func msgType(msg []byte) string {
	i := bytes.Index(msg, []byte(`"type":"`))
	if i < 0 {
		return ""
	}
	rest := msg[i+len(`"type":"`):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// parseStock reads the counters of a stockChanged payload. The driver
// reads ten thousand of these per change, so it picks the four integers
// out instead of decoding JSON; a payload without them is an error.
func parseStock(msg []byte) (Stock, error) {
	if bytes.Contains(msg, []byte(`"errors"`)) {
		return Stock{}, fmt.Errorf("subscription error: %.300s", msg)
	}
	var s Stock
	for _, f := range []struct {
		key string
		to  *int
	}{{`"available":`, &s.Available}, {`"held":`, &s.Held}, {`"sold":`, &s.Sold}, {`"total":`, &s.Total}} {
		i := bytes.Index(msg, []byte(f.key))
		if i < 0 {
			return Stock{}, fmt.Errorf("no %s in %.200s", f.key, msg)
		}
		rest := msg[i+len(f.key):]
		j := 0
		for j < len(rest) && (rest[j] == '-' || (rest[j] >= '0' && rest[j] <= '9')) {
			j++
		}
		v, err := strconv.Atoi(string(rest[:j]))
		if err != nil {
			return Stock{}, fmt.Errorf("bad %s in %.200s", f.key, msg)
		}
		*f.to = v
	}
	return s, nil
}
