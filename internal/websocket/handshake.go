package websocket

import (
	"bufio"
	"bytes"
	"crypto/sha1" //nolint:gosec // RFC 6455 fixes SHA-1 for the handshake
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
)

// ReadBufferSize is each connection's read buffer: enough for a frame
// header and a typical subscribe message, small enough that ten thousand
// idle subscribers do not hold megabytes of it.
const ReadBufferSize = 512

// HandshakeError is a refused upgrade: the status and text the client gets.
type HandshakeError struct {
	Status int
	Msg    string
}

func (e *HandshakeError) Error() string { return e.Msg }

// CheckHandshake validates an upgrade request as RFC 6455 section 4.2.1
// asks, in coder/websocket's words. Headers the refusal must carry
// (Upgrade, Sec-WebSocket-Version) are set on w.
func CheckHandshake(w http.ResponseWriter, r *http.Request) error {
	refuse := func(status int, format string, args ...any) error {
		return &HandshakeError{Status: status, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case !r.ProtoAtLeast(1, 1):
		return refuse(http.StatusUpgradeRequired, "WebSocket protocol violation: handshake request must be at least HTTP/1.1: %q", r.Proto)
	case !headerHasToken(r.Header, "Connection", "Upgrade"):
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		return refuse(http.StatusUpgradeRequired, "WebSocket protocol violation: Connection header %q does not contain Upgrade", r.Header.Get("Connection"))
	case !headerHasToken(r.Header, "Upgrade", "websocket"):
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		return refuse(http.StatusUpgradeRequired, "WebSocket protocol violation: Upgrade header %q does not contain websocket", r.Header.Get("Upgrade"))
	case r.Method != http.MethodGet:
		return refuse(http.StatusMethodNotAllowed, "WebSocket protocol violation: handshake request method is not GET but %q", r.Method)
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		w.Header().Set("Sec-WebSocket-Version", "13")
		return refuse(http.StatusBadRequest, "unsupported WebSocket protocol version (only 13 is supported): %q", r.Header.Get("Sec-WebSocket-Version"))
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return refuse(http.StatusBadRequest, "WebSocket protocol violation: expected one Sec-WebSocket-Key header, got %d", len(keys))
	}
	if v, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(v) != 16 {
		return refuse(http.StatusBadRequest, "WebSocket protocol violation: invalid Sec-WebSocket-Key %q, must be a 16 byte base64 encoded string", keys[0])
	}
	return nil
}

// headerTokens splits a comma-separated header into its tokens.
func headerTokens(h http.Header, key string) []string {
	var tokens []string
	for _, v := range h[textproto.CanonicalMIMEHeaderKey(key)] {
		for t := range strings.SplitSeq(v, ",") {
			tokens = append(tokens, strings.TrimSpace(t))
		}
	}
	return tokens
}

func headerHasToken(h http.Header, key, token string) bool {
	for _, t := range headerTokens(h, key) {
		if strings.EqualFold(t, token) {
			return true
		}
	}
	return false
}

// SelectSubprotocol picks the first of ours (in our order) that the client
// offers, spelled as the client spelled it; "" when it offers none of them.
func SelectSubprotocol(r *http.Request, ours []string) string {
	offered := headerTokens(r.Header, "Sec-WebSocket-Protocol")
	for _, p := range ours {
		for _, o := range offered {
			if strings.EqualFold(p, o) {
				return o
			}
		}
	}
	return ""
}

// release lets go of the buffers of a hijacked connection's reader and
// writer. They are net/http's own (its connection's 4 KiB reader and 4 KiB
// writer, handed over by Hijack), and net/http keeps pointing at them for
// as long as the handler runs, which for a websocket is the connection's
// whole life: 8 KiB per connection, a quarter of what an idle subscriber
// costs. After Hijack neither is used again by net/http (a write to the
// ResponseWriter fails with ErrHijacked before it reaches them), and the
// caller has taken what the reader held, so both are reset to their zero
// values and their buffers become garbage.
func release(brw *bufio.ReadWriter) {
	if brw == nil {
		return
	}
	if brw.Reader != nil {
		*brw.Reader = bufio.Reader{}
	}
	if brw.Writer != nil {
		*brw.Writer = bufio.Writer{}
	}
}

var acceptGUID = []byte("258EAFA5-E914-47DA-95CA-C5AB0DC85B11")

func secWebSocketAccept(key string) string {
	h := sha1.New() //nolint:gosec // see the import
	h.Write([]byte(strings.TrimSpace(key)))
	h.Write(acceptGUID)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// Upgrade answers 101 to a request CheckHandshake accepted and takes the
// connection from net/http. Headers already set on w (CORS, the request
// id) go out with the 101. The returned reader holds anything the client
// sent after its request, then reads the connection through a buffer of
// ReadBufferSize.
func Upgrade(w http.ResponseWriter, r *http.Request, subprotocol string) (net.Conn, *bufio.Reader, error) {
	h := w.Header()
	h.Set("Upgrade", "websocket")
	h.Set("Connection", "Upgrade")
	h.Set("Sec-WebSocket-Accept", secWebSocketAccept(r.Header.Get("Sec-WebSocket-Key")))
	if subprotocol != "" {
		h.Set("Sec-WebSocket-Protocol", subprotocol)
	}
	netConn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("hijacking the connection: %w", err)
	}
	var early []byte
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Peek(n)
		early = bytes.Clone(b)
	}
	release(brw)
	var resp bytes.Buffer
	resp.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	if err := h.Write(&resp); err != nil {
		_ = netConn.Close()
		return nil, nil, err
	}
	resp.WriteString("\r\n")
	if _, err := netConn.Write(resp.Bytes()); err != nil {
		_ = netConn.Close()
		return nil, nil, fmt.Errorf("writing the upgrade response: %w", err)
	}
	var src io.Reader = netConn
	if len(early) > 0 {
		src = io.MultiReader(bytes.NewReader(early), netConn)
	}
	return netConn, bufio.NewReaderSize(src, ReadBufferSize), nil
}
