package websocket

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ProtocolError is a client frame the protocol forbids: the connection is
// to be closed with Code.
type ProtocolError struct {
	Code   int
	Reason string
}

func (e *ProtocolError) Error() string { return e.Reason }

// TooBigError is a message over the reader's limit: the connection is to
// be closed with CloseMessageTooBig. It says what coder/websocket says.
type TooBigError struct {
	Limit int64
}

func (e *TooBigError) Error() string { return fmt.Sprintf("read limited at %d bytes", e.Limit+1) }

// CloseError is the client's close frame: the close handshake answers it
// with the same code.
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("websocket closed by the client: status = %d and reason = %q", e.Code, e.Reason)
}

// Hooks are what a connection does while its Reader reads.
type Hooks interface {
	// MessageBegins is called when the first byte of a message, or of a
	// control frame between messages, has arrived, and MessageEnds when
	// it has been read: a connection bounds the time between the two, so
	// that a client trickling a message byte by byte, or frame by frame,
	// cannot hold it for ever. Neither is called for the frames inside a
	// message, and MessageEnds is not called when reading fails.
	MessageBegins()
	MessageEnds()
	// Ping is called with a ping's payload, which the pong must carry
	// back; the reader goes on at once.
	Ping(payload []byte)
}

// Reader reads a client's frames, one data message at a time. It is used
// by one goroutine.
type Reader struct {
	br    *bufio.Reader
	limit int64
	hooks Hooks
	// skip is what is left unread of a frame that went over the limit.
	skip int64
	buf  [8]byte
}

// NewReader reads from br messages of at most limit bytes.
func NewReader(br *bufio.Reader, limit int64, hooks Hooks) *Reader {
	return &Reader{br: br, limit: limit, hooks: hooks}
}

// ReadMessage returns the client's next data message and its opcode
// (OpText or OpBinary), its frames joined and unmasked. Pings on the way
// go to Hooks.Ping and pongs are dropped. It waits as long as it takes for
// a message to begin. The error is the connection's end: a *CloseError
// (the client's close), a *ProtocolError, a *TooBigError, or the
// connection's own (io.EOF when it ended, within a frame or between).
func (r *Reader) ReadMessage() (Opcode, []byte, error) {
	var msg []byte
	var op Opcode
	inMessage := false
	for {
		if _, err := r.br.Peek(1); err != nil {
			return 0, nil, err
		}
		if !inMessage {
			r.hooks.MessageBegins()
		}
		h, err := r.ReadHeader()
		if err != nil {
			return 0, nil, err
		}
		if h.Op.Control() {
			p, err := r.readPayload(nil, h)
			if err != nil {
				return 0, nil, err
			}
			switch h.Op {
			case OpClose:
				code, reason, err := ParseClose(p)
				if err != nil {
					return 0, nil, err
				}
				return 0, nil, &CloseError{Code: code, Reason: reason}
			case OpPing:
				r.hooks.Ping(p)
			}
			if !inMessage {
				r.hooks.MessageEnds()
			}
			continue
		}
		if (h.Op == OpContinuation) != inMessage {
			return 0, nil, &ProtocolError{CloseProtocolError, "unexpected continuation or data frame"}
		}
		if !inMessage {
			op, inMessage = h.Op, true
		}
		// Compared this way round, a length near 2^63 cannot carry the
		// sum past int64 and under the limit: len(msg) <= limit.
		if h.Length > r.limit-int64(len(msg)) {
			r.skip = h.Length
			return 0, nil, &TooBigError{Limit: r.limit}
		}
		if msg, err = r.readPayload(msg, h); err != nil {
			return 0, nil, err
		}
		if h.Fin {
			r.hooks.MessageEnds()
			return op, msg, nil
		}
	}
}

// ReadHeader reads a frame's header and checks it: no reserved bits, a
// client's mask, a defined opcode, and a control frame final and at most
// 125 bytes long.
func (r *Reader) ReadHeader() (Header, error) {
	var h Header
	b, err := r.readN(2)
	if err != nil {
		return h, err
	}
	h.Fin = b[0]&0x80 != 0
	h.Op = Opcode(b[0] & 0x0f)
	if b[0]&0x70 != 0 {
		return h, &ProtocolError{CloseProtocolError, "received header with unexpected rsv bits set"}
	}
	if b[1]&0x80 == 0 {
		return h, &ProtocolError{CloseProtocolError, "received unmasked frame from client"}
	}
	switch n := b[1] & 0x7f; n {
	case 126:
		if b, err = r.readN(2); err != nil {
			return h, err
		}
		h.Length = int64(binary.BigEndian.Uint16(b))
	case 127:
		if b, err = r.readN(8); err != nil {
			return h, err
		}
		u := binary.BigEndian.Uint64(b)
		if u>>63 != 0 {
			return h, &ProtocolError{CloseProtocolError, "received frame with a negative length"}
		}
		h.Length = int64(u)
	default:
		h.Length = int64(n)
	}
	if b, err = r.readN(4); err != nil {
		return h, err
	}
	copy(h.Mask[:], b)
	switch h.Op {
	case OpContinuation, OpText, OpBinary:
	case OpClose, OpPing, OpPong:
		if !h.Fin {
			return h, &ProtocolError{CloseProtocolError, "received fragmented control frame"}
		}
		if h.Length > maxControlPayload {
			return h, &ProtocolError{CloseProtocolError, "received control frame payload with invalid length"}
		}
	default:
		return h, &ProtocolError{CloseProtocolError, fmt.Sprintf("received unknown opcode %#x", byte(h.Op))}
	}
	return h, nil
}

// readN reads n (at most 8) bytes into the reader's scratch buffer. A
// header cut short ends like the connection: io.EOF.
func (r *Reader) readN(n int) ([]byte, error) {
	b := r.buf[:n]
	if _, err := io.ReadFull(r.br, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return b, err
	}
	return b, nil
}

// readPayload reads h's payload onto dst, unmasked. The caller has
// bounded h.Length.
func (r *Reader) readPayload(dst []byte, h Header) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, h.Length)...)
	if _, err := io.ReadFull(r.br, dst[start:]); err != nil {
		return dst, err
	}
	for i := range dst[start:] {
		dst[start+i] ^= h.Mask[i&3]
	}
	return dst, nil
}

// AwaitClose reads and drops what the client sends until its close frame
// (or an error, or the end of the connection), after the server sent its
// own: a socket closed with unread data would be reset, and the client
// would lose the close frame. It first drops the rest of a frame that
// went over the limit. The caller bounds the wait with a read deadline.
func (r *Reader) AwaitClose() {
	if r.skip > 0 {
		n := r.skip
		r.skip = 0
		if _, err := io.CopyN(io.Discard, r.br, n); err != nil {
			return
		}
	}
	for {
		h, err := r.ReadHeader()
		if err != nil {
			return
		}
		if h.Op == OpClose {
			_, _ = r.readPayload(nil, h)
			return
		}
		if _, err := io.CopyN(io.Discard, r.br, h.Length); err != nil {
			return
		}
	}
}
