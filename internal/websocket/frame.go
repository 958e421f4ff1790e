package websocket

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Opcode is a frame's opcode (RFC 6455 section 5.2).
type Opcode byte

// The opcodes the protocol defines; any other is refused.
const (
	OpContinuation Opcode = 0x0
	OpText         Opcode = 0x1
	OpBinary       Opcode = 0x2
	OpClose        Opcode = 0x8
	OpPing         Opcode = 0x9
	OpPong         Opcode = 0xa
)

// Control reports whether op is a control frame's (close, ping, pong).
func (op Opcode) Control() bool { return op&0x8 != 0 }

// Close codes of the protocol itself (RFC 6455 section 7.4.1).
const (
	CloseNormal         = 1000
	CloseProtocolError  = 1002
	CloseNoStatus       = 1005 // never sent: a close frame without a code
	CloseInvalidPayload = 1007
	CloseMessageTooBig  = 1009
)

// maxControlPayload is the most a control frame may carry.
const maxControlPayload = 125

// Header is a client frame's header.
type Header struct {
	Fin    bool
	Op     Opcode
	Length int64
	Mask   [4]byte
}

// ValidCloseCode reports whether a peer may send code in a close frame:
// 1000-1014 except the three that only describe a close (1004, 1005,
// 1006), and 3000-4999 (libraries and applications).
func ValidCloseCode(code int) bool {
	switch {
	case code >= 3000 && code <= 4999:
		return true
	case code < 1000 || code > 1014:
		return false
	}
	return code != 1004 && code != CloseNoStatus && code != 1006
}

// ParseClose reads a close frame's payload: no payload is CloseNoStatus.
func ParseClose(p []byte) (code int, reason string, err error) {
	switch {
	case len(p) == 0:
		return CloseNoStatus, "", nil
	case len(p) == 1:
		return 0, "", &ProtocolError{CloseProtocolError, "close frame of one byte"}
	}
	code = int(binary.BigEndian.Uint16(p))
	reason = string(p[2:])
	if !ValidCloseCode(code) {
		return 0, "", &ProtocolError{CloseProtocolError, fmt.Sprintf("invalid close code %d", code)}
	}
	if !utf8.ValidString(reason) {
		return 0, "", &ProtocolError{CloseInvalidPayload, "close reason is not UTF-8"}
	}
	return code, reason, nil
}

// AppendHeader appends an unmasked, final server frame header for a
// payload of n bytes, its length in the fewest bytes that hold it.
func AppendHeader(b []byte, op Opcode, n int) []byte {
	b = append(b, 0x80|byte(op))
	switch {
	case n <= 125:
		return append(b, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
}

// TextFrame frames one text message.
func TextFrame(payload []byte) []byte {
	b := AppendHeader(make([]byte, 0, len(payload)+10), OpText, len(payload))
	return append(b, payload...)
}

// CloseFrame frames a close with code and reason (at most 123 bytes of
// it, cut at a rune boundary); CloseNoStatus sends an empty close.
func CloseFrame(code int, reason string) []byte {
	if code == CloseNoStatus {
		return AppendHeader(nil, OpClose, 0)
	}
	for len(reason) > maxControlPayload-2 {
		_, size := utf8.DecodeLastRuneInString(reason)
		reason = reason[:len(reason)-size]
	}
	b := AppendHeader(make([]byte, 0, 4+len(reason)), OpClose, 2+len(reason))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	return append(b, reason...)
}
