package websocket

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// recorder is Hooks that notes pings as pong events, and checks that
// MessageBegins and MessageEnds come in pairs.
type recorder struct {
	events []string
	open   bool
	err    error
}

func (r *recorder) MessageBegins() {
	if r.open && r.err == nil {
		r.err = errors.New("MessageBegins twice")
	}
	r.open = true
}

func (r *recorder) MessageEnds() {
	if !r.open && r.err == nil {
		r.err = errors.New("MessageEnds without MessageBegins")
	}
	r.open = false
}

func (r *recorder) Ping(p []byte) { r.events = append(r.events, event("pong", p)) }

// readAll reads messages from in until the reader fails, and returns what
// a server on the reader would answer, as the cases spell it.
func readAll(in io.Reader, limit int64) (answer, *recorder, error) {
	rec := &recorder{}
	rd := NewReader(bufio.NewReaderSize(in, ReadBufferSize), limit, rec)
	for {
		op, msg, err := rd.ReadMessage()
		if err == nil {
			kind := "text"
			if op == OpBinary {
				kind = "binary"
			}
			if int64(len(msg)) > limit {
				return nil, rec, errors.New("a message over the limit was returned")
			}
			rec.events = append(rec.events, event(kind, msg))
			continue
		}
		return append(rec.events, answerTo(err)), rec, nil
	}
}

// answerTo is how a server ends a connection whose reader failed with err.
func answerTo(err error) string {
	var ce *CloseError
	var pe *ProtocolError
	var tb *TooBigError
	switch {
	case errors.As(err, &ce):
		return closed(ce.Code)
	case errors.As(err, &pe):
		return closed(pe.Code)
	case errors.As(err, &tb):
		return closed(CloseMessageTooBig)
	}
	return dropped
}

func TestReader(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{caseLimit, corpusLimit} {
		for _, c := range edgeCases(limit) {
			t.Run(fmt.Sprintf("%s/limit %d", c.name, limit), func(t *testing.T) {
				got, rec, err := readAll(bytes.NewReader(c.in), int64(limit))
				require.NoError(t, err)
				require.NoError(t, rec.err)
				require.Equal(t, c.want, got)
			})
		}
	}
}

// A frame's bytes may arrive one at a time: the reader answers the same.
func TestReaderOneByteAtATime(t *testing.T) {
	t.Parallel()
	for _, c := range edgeCases(caseLimit) {
		got, _, err := readAll(oneByteReader{bytes.NewReader(c.in)}, caseLimit)
		require.NoError(t, err)
		require.Equal(t, c.want, got, c.name)
	}
}

type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

// AwaitClose drops the rest of a message over the limit and everything up
// to the client's close frame, and stops there.
func TestAwaitCloseReadsUpToTheClientsClose(t *testing.T) {
	t.Parallel()
	in := frames(frame{op: OpText, payload: make([]byte, caseLimit+10)}, text("dropped"), frame{op: OpPing}, closeWith(1000, "ok"), text("after"))
	br := bufio.NewReader(bytes.NewReader(in))
	rd := NewReader(br, caseLimit, &recorder{})
	_, _, err := rd.ReadMessage()
	var tb *TooBigError
	require.ErrorAs(t, err, &tb)
	require.Equal(t, "read limited at 65537 bytes", err.Error())
	rd.AwaitClose()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	require.Equal(t, text("after").bytes(), rest)
}

func TestServerFrames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int
		head []byte
	}{
		{0, []byte{0x81, 0}},
		{125, []byte{0x81, 125}},
		{126, []byte{0x81, 126, 0, 126}},
		{65535, []byte{0x81, 126, 0xff, 0xff}},
		{65536, []byte{0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0}},
	} {
		f := TextFrame(make([]byte, c.n))
		require.Equal(t, c.head, f[:len(c.head)], "length %d", c.n)
		require.Len(t, f, len(c.head)+c.n)
	}
	require.Equal(t, []byte{0x88, 0}, CloseFrame(CloseNoStatus, "ignored"))
	require.Equal(t, []byte{0x88, 5, 0x03, 0xe8, 'b', 'y', 'e'}, CloseFrame(CloseNormal, "bye"))
	// A reason too long for a control frame is cut at a rune boundary.
	long := strings.Repeat("\u20ac", 50) // 150 bytes
	f := CloseFrame(4403, long)
	require.Equal(t, byte(125), f[1])
	reason := f[4:]
	require.True(t, utf8.Valid(reason))
	require.Len(t, reason, 123)
	require.Equal(t, strings.Repeat("\u20ac", 41), string(reason))
}
