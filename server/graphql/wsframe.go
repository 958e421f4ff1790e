package graphql

import (
	"bufio"
	"bytes"
	"crypto/sha1" //nolint:gosec // RFC 6455 fixes SHA-1 for the handshake
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"unicode/utf8"
)

// The websocket protocol (RFC 6455), server side, as much of it as GraphQL
// subscriptions use: the upgrade, client frames read one message at a
// time under a size limit, and server frames built in memory so a fan-out
// can hand many connections the same bytes. No extensions (compression is
// never negotiated, as before).

// Websocket opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// Close codes of the protocol itself.
const (
	closeNormal         = 1000
	closeProtocolError  = 1002
	closeNoStatus       = 1005
	closeInvalidPayload = 1007
	closeMessageTooBig  = 1009
)

// wsReadBufferSize is each connection's read buffer: enough for a frame
// header and a typical subscribe message, small enough that ten thousand
// idle subscribers do not hold megabytes of it.
const wsReadBufferSize = 512

// handshakeError is a refused upgrade: the status and text the client gets.
type handshakeError struct {
	status int
	msg    string
}

func (e *handshakeError) Error() string { return e.msg }

// checkHandshake validates an upgrade request as RFC 6455 section 4.2.1 asks.
func checkHandshake(w http.ResponseWriter, r *http.Request) error {
	refuse := func(status int, format string, args ...any) error {
		return &handshakeError{status: status, msg: fmt.Sprintf(format, args...)}
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

// selectSubprotocol picks the first of ours (in our order) that the client
// offers, spelled as the client spelled it.
func selectSubprotocol(r *http.Request, ours []string) string {
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

var acceptGUID = []byte("258EAFA5-E914-47DA-95CA-C5AB0DC85B11")

func secWebSocketAccept(key string) string {
	h := sha1.New() //nolint:gosec // see the import
	h.Write([]byte(strings.TrimSpace(key)))
	h.Write(acceptGUID)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// upgrade answers 101 and takes the connection from net/http. Headers
// already set on w (CORS, the request id) go out with the 101. The
// returned reader holds anything the client sent after its request, then
// reads the connection through a small buffer.
func upgrade(w http.ResponseWriter, r *http.Request, subprotocol string) (net.Conn, *bufio.Reader, error) {
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
	return netConn, bufio.NewReaderSize(src, wsReadBufferSize), nil
}

// frameHeader is a client frame's header.
type frameHeader struct {
	fin    bool
	op     byte
	length int64
	mask   [4]byte
}

// protocolError is a client frame the protocol forbids; the connection is
// closed with code.
type protocolError struct {
	code   int
	reason string
}

func (e *protocolError) Error() string { return e.reason }

// tooBigError is a message over the read limit.
type tooBigError struct {
	limit int64
	// left is what remains unread of the frame that went over.
	left int64
}

func (e *tooBigError) Error() string { return fmt.Sprintf("read limited at %d bytes", e.limit+1) }

// peerCloseError is the client's close frame.
type peerCloseError struct {
	code   int
	reason string
}

func (e *peerCloseError) Error() string {
	return fmt.Sprintf("websocket closed by the client: status = %d and reason = %q", e.code, e.reason)
}

func readFrameHeader(br *bufio.Reader) (frameHeader, error) {
	var h frameHeader
	b := make([]byte, 0, 14)
	b, err := readN(br, b, 2)
	if err != nil {
		return h, err
	}
	h.fin = b[0]&0x80 != 0
	h.op = b[0] & 0x0f
	if b[0]&0x70 != 0 {
		return h, &protocolError{closeProtocolError, "received header with unexpected rsv bits set"}
	}
	if b[1]&0x80 == 0 {
		return h, &protocolError{closeProtocolError, "received unmasked frame from client"}
	}
	switch n := b[1] & 0x7f; n {
	case 126:
		if b, err = readN(br, b[:0], 2); err != nil {
			return h, err
		}
		h.length = int64(binary.BigEndian.Uint16(b))
	case 127:
		if b, err = readN(br, b[:0], 8); err != nil {
			return h, err
		}
		u := binary.BigEndian.Uint64(b)
		if u>>63 != 0 {
			return h, &protocolError{closeProtocolError, "received frame with a negative length"}
		}
		h.length = int64(u)
	default:
		h.length = int64(n)
	}
	if b, err = readN(br, b[:0], 4); err != nil {
		return h, err
	}
	copy(h.mask[:], b)
	switch h.op {
	case opContinuation, opText, opBinary:
	case opClose, opPing, opPong:
		if !h.fin {
			return h, &protocolError{closeProtocolError, "received fragmented control frame"}
		}
		if h.length > 125 {
			return h, &protocolError{closeProtocolError, "received control frame payload with invalid length"}
		}
	default:
		return h, &protocolError{closeProtocolError, fmt.Sprintf("received unknown opcode %#x", h.op)}
	}
	return h, nil
}

func readN(br *bufio.Reader, b []byte, n int) ([]byte, error) {
	b = b[:n]
	if _, err := io.ReadFull(br, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return b, err
	}
	return b, nil
}

// readPayload reads n masked bytes onto dst.
func readPayload(br *bufio.Reader, dst []byte, h frameHeader, n int64) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	if _, err := io.ReadFull(br, dst[start:]); err != nil {
		return dst, err
	}
	for i := range dst[start:] {
		dst[start+i] ^= h.mask[i&3]
	}
	return dst, nil
}

// parseClose reads a close frame's payload.
func parseClose(p []byte) (code int, reason string, err error) {
	switch {
	case len(p) == 0:
		return closeNoStatus, "", nil
	case len(p) == 1:
		return 0, "", &protocolError{closeProtocolError, "close frame of one byte"}
	}
	code = int(binary.BigEndian.Uint16(p))
	reason = string(p[2:])
	if !validCloseCode(code) {
		return 0, "", &protocolError{closeProtocolError, fmt.Sprintf("invalid close code %d", code)}
	}
	if !utf8.ValidString(reason) {
		return 0, "", &protocolError{closeInvalidPayload, "close reason is not UTF-8"}
	}
	return code, reason, nil
}

func validCloseCode(c int) bool {
	switch {
	case c >= 3000 && c <= 4999:
		return true
	case c < 1000 || c > 1014:
		return false
	}
	return c != 1004 && c != closeNoStatus && c != 1006
}

// appendFrameHeader appends an unmasked, final server frame header for a
// payload of n bytes.
func appendFrameHeader(b []byte, op byte, n int) []byte {
	b = append(b, 0x80|op)
	switch {
	case n <= 125:
		return append(b, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
}

// textFrame frames one text message.
func textFrame(payload []byte) []byte {
	b := appendFrameHeader(make([]byte, 0, len(payload)+10), opText, len(payload))
	return append(b, payload...)
}

// closeFrame frames a close with code and reason (at most 123 bytes of
// it, cut at a rune boundary); closeNoStatus sends an empty close.
func closeFrame(code int, reason string) []byte {
	if code == closeNoStatus {
		return appendFrameHeader(nil, opClose, 0)
	}
	for len(reason) > 123 {
		_, size := utf8.DecodeLastRuneInString(reason)
		reason = reason[:len(reason)-size]
	}
	b := appendFrameHeader(make([]byte, 0, 4+len(reason)), opClose, 2+len(reason))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	return append(b, reason...)
}
