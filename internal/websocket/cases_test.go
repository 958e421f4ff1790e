package websocket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
)

// The cases of the protocol's edges that TestReader, FuzzReader's seed
// corpus and the differential tests against coder/websocket share: what a
// client sends, as raw bytes, and what a server answers. A server's answer
// is what a client sees: the messages echoed back and the pongs, in order,
// then how the connection ended.

// caseLimit is the message limit of the cases the tests run: a message of
// 65,536 bytes needs a 64-bit length, and is the largest one accepted.
// FuzzReader's seed corpus holds the cases at corpusLimit, so that its
// entries stay small.
const (
	caseLimit   = 1 << 16
	corpusLimit = 256
)

// frame is a client frame to build. Its zero value is a final, masked text
// frame whose length takes the fewest bytes.
type frame struct {
	notFin   bool
	rsv      byte // the three reserved bits, as 0-7
	op       Opcode
	payload  []byte
	unmasked bool
	// lenBytes forces the length's encoding: 1 (7 bits), 2 (16) or 8
	// (64); 0 is the fewest bytes.
	lenBytes int
	// length, when not zero, is the length declared instead of the
	// payload's own (the payload is sent as it is).
	length uint64
	mask   [4]byte
}

// defaultMask is the mask of a frame that does not name one.
var defaultMask = [4]byte{0x37, 0xfa, 0x21, 0x3d}

func (f frame) bytes() []byte {
	b := []byte{byte(f.op) | f.rsv<<4}
	if !f.notFin {
		b[0] |= 0x80
	}
	n := uint64(len(f.payload))
	if f.length != 0 {
		n = f.length
	}
	maskBit := byte(0x80)
	if f.unmasked {
		maskBit = 0
	}
	enc := f.lenBytes
	if enc == 0 {
		switch {
		case n <= 125:
			enc = 1
		case n <= 0xffff:
			enc = 2
		default:
			enc = 8
		}
	}
	switch enc {
	case 1:
		b = append(b, maskBit|byte(n))
	case 2:
		b = binary.BigEndian.AppendUint16(append(b, maskBit|126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, maskBit|127), n)
	}
	mask := f.mask
	if mask == [4]byte{} && !f.unmasked {
		mask = defaultMask
	}
	if f.unmasked {
		return append(b, f.payload...)
	}
	b = append(b, mask[:]...)
	for i, c := range f.payload {
		b = append(b, c^mask[i&3])
	}
	return b
}

func frames(fs ...frame) []byte {
	var b []byte
	for _, f := range fs {
		b = append(b, f.bytes()...)
	}
	return b
}

func text(s string) frame      { return frame{op: OpText, payload: []byte(s)} }
func binaryMsg(s string) frame { return frame{op: OpBinary, payload: []byte(s)} }

// closeWith is a close frame's payload: code, then reason.
func closeWith(code int, reason string) frame {
	return frame{op: OpClose, payload: append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...)}
}

// answer is what a server answered: "text:<payload>", "binary:<payload>",
// "pong:<payload>" (a payload over 64 bytes shown by its length and first
// bytes), then "close <code>" or "dropped" (the connection ended without a
// close frame).
type answer []string

func event(kind string, p []byte) string {
	if len(p) > 64 {
		return fmt.Sprintf("%s:[%d bytes %q...]", kind, len(p), p[:16])
	}
	return kind + ":" + string(p)
}

func closed(code int) string { return fmt.Sprintf("close %d", code) }

const dropped = "dropped"

// edgeCase is what a client sends and what the server answers, ours and,
// where it answers otherwise (and why), coder/websocket's.
type edgeCase struct {
	name  string
	in    []byte
	want  answer
	coder answer // nil: as want
}

var (
	notUTF8    = "caf\xc3\x28 \xff"
	maxControl = strings.Repeat("p", 125)
)

// edgeCases are the cases for a reader whose limit is limit (at least
// 200).
func edgeCases(limit int) []edgeCase {
	big := bytes.Repeat([]byte("x"), limit)
	tooBig := bytes.Repeat([]byte("y"), limit+1)
	var cs []edgeCase
	add := func(name string, in []byte, want ...string) {
		cs = append(cs, edgeCase{name: name, in: in, want: want})
	}
	// Lengths and their encodings.
	add("text", frames(text("hello")), "text:hello", dropped)
	add("binary", frames(binaryMsg("\x00\x01\xff")), "binary:\x00\x01\xff", dropped)
	add("empty text", frames(text("")), "text:", dropped)
	add("two messages", frames(text("a"), binaryMsg("b")), "text:a", "binary:b", dropped)
	for _, n := range []int{125, 126, 65535, 65536} {
		if n > limit {
			continue
		}
		p := big[:n]
		add(fmt.Sprintf("length %d", n), frames(frame{op: OpText, payload: p}), event("text", p), dropped)
	}
	add("16-bit length of 2 (overlong)", frames(frame{op: OpText, payload: []byte("hi"), lenBytes: 2}), "text:hi", dropped)
	add("64-bit length of 2 (overlong)", frames(frame{op: OpText, payload: []byte("hi"), lenBytes: 8}), "text:hi", dropped)
	add("64-bit length of 200 (overlong)", frames(frame{op: OpText, payload: big[:200], lenBytes: 8}), event("text", big[:200]), dropped)
	add("16-bit length of 0 (overlong)", frames(frame{op: OpText, lenBytes: 2}), "text:", dropped)
	// Masks.
	for _, m := range [][4]byte{{0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}, {0x80, 0, 0x01, 0x7f}} {
		f := text("masked payload of some length")
		f.mask = m
		if m == [4]byte{} {
			// The zero mask, spelled out: frame.bytes takes a zero mask
			// for "the default".
			b := []byte{0x81, 0x80 | byte(len(f.payload)), 0, 0, 0, 0}
			add("mask 00000000", append(b, f.payload...), "text:masked payload of some length", dropped)
			continue
		}
		add(fmt.Sprintf("mask %x", m), frames(f), "text:masked payload of some length", dropped)
	}
	// Fragmentation.
	add("fragmented", frames(frame{op: OpText, notFin: true, payload: []byte("hel")}, frame{op: OpContinuation, payload: []byte("lo")}), "text:hello", dropped)
	add("fragmented binary in three", frames(frame{op: OpBinary, notFin: true, payload: []byte("a")},
		frame{op: OpContinuation, notFin: true, payload: []byte("b")}, frame{op: OpContinuation, payload: []byte("c")}), "binary:abc", dropped)
	add("empty fragments", frames(frame{op: OpText, notFin: true}, frame{op: OpContinuation, notFin: true},
		frame{op: OpContinuation, notFin: true, payload: []byte("x")}, frame{op: OpContinuation}), "text:x", dropped)
	add("a hundred fragments", func() []byte {
		var b []byte
		b = append(b, frame{op: OpText, notFin: true, payload: []byte("0")}.bytes()...)
		for range 98 {
			b = append(b, frame{op: OpContinuation, notFin: true, payload: []byte("1")}.bytes()...)
		}
		return append(b, frame{op: OpContinuation, payload: []byte("2")}.bytes()...)
	}(), event("text", []byte("0"+strings.Repeat("1", 98)+"2")), dropped)
	add("continuation first", frames(frame{op: OpContinuation, payload: []byte("x")}), closed(CloseProtocolError))
	add("text inside a message", frames(frame{op: OpText, notFin: true, payload: []byte("a")}, text("b")), closed(CloseProtocolError))
	add("binary inside a message", frames(frame{op: OpText, notFin: true, payload: []byte("a")}, binaryMsg("b")), closed(CloseProtocolError))
	cs = append(cs, edgeCase{name: "message never finished", in: frames(frame{op: OpText, notFin: true, payload: []byte("a")}),
		want:  answer{dropped},
		coder: answer{"text:a", dropped}, // it takes the connection's end for the message's
	})
	// Control frames, alone and inside a fragmented message.
	add("ping", frames(frame{op: OpPing, payload: []byte("are you there")}), "pong:are you there", dropped)
	add("empty ping", frames(frame{op: OpPing}), "pong:", dropped)
	add("ping of 125 bytes", frames(frame{op: OpPing, payload: []byte(maxControl)}), event("pong", []byte(maxControl)), dropped)
	add("ping of 126 bytes", frames(frame{op: OpPing, payload: []byte(maxControl + "p")}), closed(CloseProtocolError))
	add("ping of 2 bytes in 16 bits (overlong)", frames(frame{op: OpPing, payload: []byte("hi"), lenBytes: 2}), "pong:hi", dropped)
	add("fragmented ping", frames(frame{op: OpPing, notFin: true, payload: []byte("x")}), closed(CloseProtocolError))
	add("pong", frames(frame{op: OpPong, payload: []byte("unasked")}, text("after")), "text:after", dropped)
	add("ping inside a message", frames(frame{op: OpText, notFin: true, payload: []byte("he")},
		frame{op: OpPing, payload: []byte("p")}, frame{op: OpContinuation, payload: []byte("llo")}), "pong:p", "text:hello", dropped)
	add("pong inside a message", frames(frame{op: OpText, notFin: true, payload: []byte("he")},
		frame{op: OpPong, payload: []byte("p")}, frame{op: OpContinuation, payload: []byte("llo")}), "text:hello", dropped)
	add("close inside a message", frames(frame{op: OpText, notFin: true, payload: []byte("he")}, closeWith(1000, "bye")), closed(1000))
	add("fragmented close", frames(frame{op: OpClose, notFin: true, payload: []byte{0x03, 0xe8}}), closed(CloseProtocolError))
	add("close of 126 bytes", frames(closeWith(1000, maxControl[:124])), closed(CloseProtocolError))
	add("fragmented pong", frames(frame{op: OpPong, notFin: true}), closed(CloseProtocolError))
	// Close frames and their codes.
	add("close", frames(closeWith(1000, "bye")), closed(1000))
	add("close without a code", frames(frame{op: OpClose}), closed(CloseNoStatus))
	add("close of one byte", frames(frame{op: OpClose, payload: []byte{0x03}}), closed(CloseProtocolError))
	add("close with a reason of 123 bytes", frames(closeWith(4000, maxControl[:123])), closed(4000))
	for _, code := range []int{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 4403, 4999} {
		add(fmt.Sprintf("close %d", code), frames(closeWith(code, "")), closed(code))
	}
	for _, code := range []int{0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535} {
		add(fmt.Sprintf("close with invalid code %d", code), frames(closeWith(code, "")), closed(CloseProtocolError))
	}
	// Reserved bits and opcodes.
	for rsv := byte(1); rsv <= 7; rsv++ {
		f := text("r")
		f.rsv = rsv
		add(fmt.Sprintf("reserved bits %03b", rsv), frames(f), closed(CloseProtocolError))
	}
	add("reserved bit on a ping", frames(frame{op: OpPing, rsv: 4}), closed(CloseProtocolError))
	add("reserved bit on a continuation", frames(frame{op: OpText, notFin: true, payload: []byte("a")},
		frame{op: OpContinuation, rsv: 4, payload: []byte("b")}), closed(CloseProtocolError))
	for _, op := range []Opcode{3, 4, 5, 6, 7, 0xb, 0xc, 0xd, 0xe, 0xf} {
		add(fmt.Sprintf("opcode %#x", byte(op)), frames(frame{op: op, payload: []byte("?")}), closed(CloseProtocolError))
	}
	// UTF-8: text is not checked (the application decodes it), a close
	// reason is.
	add("text that is not UTF-8", frames(text(notUTF8)), "text:"+notUTF8, dropped)
	add("fragments that split a rune", frames(frame{op: OpText, notFin: true, payload: []byte("\xe2\x82")},
		frame{op: OpContinuation, payload: []byte("\xac")}), "text:\u20ac", dropped)
	cs = append(cs, edgeCase{name: "close reason that is not UTF-8", in: frames(closeWith(1000, notUTF8)),
		want:  answer{closed(CloseInvalidPayload)},
		coder: answer{closed(1000)}, // it does not check the reason
	})
	// Masking is the client's duty.
	cs = append(cs, edgeCase{name: "unmasked text", in: frames(frame{op: OpText, payload: []byte("plain"), unmasked: true}),
		want:  answer{closed(CloseProtocolError)},
		coder: answer{dropped}, // it gives up without a close frame
	})
	cs = append(cs, edgeCase{name: "unmasked close", in: frames(frame{op: OpClose, unmasked: true}),
		want:  answer{closed(CloseProtocolError)},
		coder: answer{dropped},
	})
	// The message limit.
	add("message of the limit's size", frames(frame{op: OpBinary, payload: big}), event("binary", big), dropped)
	add("message one byte over the limit", frames(frame{op: OpBinary, payload: tooBig}), closed(CloseMessageTooBig))
	add("fragments one byte over the limit", frames(frame{op: OpText, notFin: true, payload: big[:limit/2]},
		frame{op: OpContinuation, payload: tooBig[:limit+1-limit/2]}), closed(CloseMessageTooBig))
	// The frame declares 2^63-1 bytes: a server that adds it to what the
	// message has so far goes past int64. coder/websocket counts what it
	// reads, so the client sends a byte more than the limit allows, and
	// not one more (a server that closes with bytes unread resets the
	// connection, and the client may lose the close frame).
	add("continuation of 2^63-1 bytes", append(frames(frame{op: OpText, notFin: true, payload: []byte("{")}),
		frame{op: OpContinuation, length: 1<<63 - 1, payload: big}.bytes()...), closed(CloseMessageTooBig))
	add("first frame of 2^63-1 bytes", frame{op: OpText, length: 1<<63 - 1, payload: tooBig}.bytes(), closed(CloseMessageTooBig))
	cs = append(cs, edgeCase{name: "64-bit length with its top bit set", in: frame{op: OpText, length: 1 << 63, payload: []byte("x")}.bytes(),
		want:  answer{closed(CloseProtocolError)},
		coder: answer{dropped}, // it gives up without a close frame
	})
	// Frames cut short: the client went.
	whole := text("hello").bytes()
	add("header cut short", whole[:1], dropped)
	add("mask cut short", whole[:4], dropped)
	add("payload cut short", whole[:len(whole)-2], dropped)
	add("16-bit length cut short", []byte{0x81, 0x80 | 126, 0x01}, dropped)
	add("nothing", nil, dropped)
	return cs
}
