package websocket

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	coder "github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

// The differential tests put this package beside github.com/coder/websocket
// as the reference peer. Two echo servers, one on each, answer every
// message with itself and end as the protocol says; the same clients talk
// to both and must see the same thing: a raw client sending every edge
// case's bytes (TestDifferentialEdgeCases), and coder/websocket's own
// client (TestDifferentialCoderClient), whose frames our Reader must read
// and which must read our frames.

// ourEcho is an echo server on this package, ending a connection as
// server/graphql's transport does: the client's close is answered with its
// code, a protocol error or a message over the limit with its close code,
// and then the client's close frame is awaited.
func ourEcho(limit int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := CheckHandshake(w, r); err != nil {
			var he *HandshakeError
			require.ErrorAs(nil, err, &he)
			http.Error(w, he.Msg, he.Status)
			return
		}
		nc, br, err := Upgrade(w, r, "")
		if err != nil {
			return
		}
		defer nc.Close()
		rd := NewReader(br, limit, echoHooks{nc})
		for {
			op, msg, err := rd.ReadMessage()
			if err == nil {
				_, _ = nc.Write(append(AppendHeader(nil, op, len(msg)), msg...))
				continue
			}
			var ce *CloseError
			var pe *ProtocolError
			var tb *TooBigError
			switch {
			case errors.As(err, &ce):
				_, _ = nc.Write(CloseFrame(ce.Code, ce.Reason))
				return
			case errors.As(err, &pe):
				_, _ = nc.Write(CloseFrame(pe.Code, pe.Reason))
			case errors.As(err, &tb):
				_, _ = nc.Write(CloseFrame(CloseMessageTooBig, tb.Error()))
			default:
				return
			}
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			rd.AwaitClose()
			return
		}
	}
}

type echoHooks struct{ nc net.Conn }

func (echoHooks) MessageBegins() {}
func (echoHooks) MessageEnds()   {}
func (h echoHooks) Ping(p []byte) {
	_, _ = h.nc.Write(append(AppendHeader(nil, OpPong, len(p)), p...))
}

// coderEcho is the same server on coder/websocket.
func coderEcho(limit int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := coder.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(limit)
		ctx := r.Context()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	}
}

// peers starts both echo servers and returns their URLs by name.
func peers(t *testing.T, limit int64) map[string]string {
	t.Helper()
	urls := map[string]string{}
	for name, h := range map[string]http.HandlerFunc{"ours": ourEcho(limit), "coder": coderEcho(limit)} {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls[name] = "ws" + strings.TrimPrefix(srv.URL, "http")
	}
	return urls
}

// TestDifferentialEdgeCases sends each edge case's bytes to both servers
// and requires each to answer as the case says: the same, except where
// the case names coder/websocket's own answer (and why).
func TestDifferentialEdgeCases(t *testing.T) {
	t.Parallel()
	urls := peers(t, caseLimit)
	for _, c := range edgeCases(caseLimit) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, rawConverse(t, urls["ours"], c.in), "ours")
			want := c.want
			if c.coder != nil {
				want = c.coder
			}
			require.Equal(t, want, rawConverse(t, urls["coder"], c.in), "coder/websocket")
		})
	}
}

// rawConverse upgrades a raw TCP connection, sends in and ends its side
// of the connection, then reads what the server answers.
func rawConverse(t *testing.T, url string, in []byte) answer {
	t.Helper()
	host := strings.TrimPrefix(url, "ws://")
	nc, err := net.Dial("tcp", host)
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	require.NoError(t, err)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil) //nolint:bodyclose // a 101 has no body
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	require.Equal(t, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", resp.Header.Get("Sec-WebSocket-Accept"))
	// Write while the answers are read: a server may answer (and a
	// kernel's buffers fill) before all of in is sent.
	wrote := make(chan error, 1)
	go func() {
		_, err := nc.Write(in)
		if err == nil {
			err = nc.(*net.TCPConn).CloseWrite()
		}
		wrote <- err
	}()
	var got answer
	for {
		op, p, err := readServerFrame(br)
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server neither answered nor closed: %v", err)
			got = append(got, dropped)
			break
		}
		if op == OpClose {
			code := CloseNoStatus
			if len(p) >= 2 {
				code = int(binary.BigEndian.Uint16(p))
			}
			got = append(got, closed(code))
			break
		}
		got = append(got, event(map[Opcode]string{OpText: "text", OpBinary: "binary", OpPong: "pong", OpPing: "ping"}[op], p))
	}
	// A server that closed early may have made the write fail: that is
	// not the answer.
	_ = nc.Close()
	<-wrote
	return got
}

// readServerFrame reads one frame a server sent: unmasked, and final (a
// server here never splits a message).
func readServerFrame(br *bufio.Reader) (Opcode, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0]&0x80 == 0 || h[0]&0x70 != 0 || h[1]&0x80 != 0 {
		return 0, nil, fmt.Errorf("a server frame with header %x", h)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126, 127:
		ext := make([]byte, 2+6*(n-126))
		if _, err := io.ReadFull(br, ext); err != nil {
			return 0, nil, err
		}
		n = 0
		for _, b := range ext {
			n = n<<8 | uint64(b)
		}
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("a server frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		return 0, nil, err
	}
	return Opcode(h[0] & 0x0f), p, nil
}

// TestDifferentialCoderClient: coder/websocket's client talks to both
// servers: messages of every length encoding, both types, fragmented by
// its Writer (with a ping sent between two of the fragments), pings, its
// close with each kind of code, and messages at and over the limit. The
// servers' Reader reads its frames, and it reads theirs; both servers
// must leave it with the same transcript, which is the expected one.
func TestDifferentialCoderClient(t *testing.T) {
	t.Parallel()
	urls := peers(t, caseLimit)
	type script struct {
		name string
		run  func(ctx context.Context, c *clientConn) []string
		want []string
	}
	var scripts []script
	for _, n := range []int{0, 1, 125, 126, 127, 1000, 65535, caseLimit} {
		for _, typ := range []coder.MessageType{coder.MessageText, coder.MessageBinary} {
			msg := bytes.Repeat([]byte{'a' + byte(n%26)}, n)
			scripts = append(scripts, script{
				name: fmt.Sprintf("%s of %d bytes", typ, n),
				run: func(ctx context.Context, c *clientConn) []string {
					return []string{c.write(ctx, typ, msg), c.read(ctx)}
				},
				want: []string{"ok", event(strings.ToLower(strings.TrimPrefix(typ.String(), "Message")), msg)},
			})
		}
	}
	scripts = append(scripts,
		script{
			name: "fragmented, a ping between two fragments",
			run: func(ctx context.Context, c *clientConn) []string {
				w, err := c.Writer(ctx, coder.MessageText)
				if err != nil {
					return []string{err.Error()}
				}
				out := []string{}
				for i, part := range []string{"frag", "", "mented ", strings.Repeat("z", 300)} {
					if _, err := w.Write([]byte(part)); err != nil {
						return append(out, err.Error())
					}
					if i == 1 {
						out = append(out, c.ping(ctx))
					}
				}
				out = append(out, errString(w.Close()))
				return append(out, c.read(ctx))
			},
			want: []string{"pong", "ok", event("text", []byte("fragmented "+strings.Repeat("z", 300)))},
		},
		script{
			name: "pings",
			run: func(ctx context.Context, c *clientConn) []string {
				return []string{c.ping(ctx), c.ping(ctx), c.write(ctx, coder.MessageText, []byte("after")), c.read(ctx)}
			},
			want: []string{"pong", "pong", "ok", "text:after"},
		},
		script{
			name: "a message over the limit",
			run: func(ctx context.Context, c *clientConn) []string {
				return []string{c.write(ctx, coder.MessageBinary, make([]byte, caseLimit+1)), c.read(ctx)}
			},
			want: []string{"ok", closed(CloseMessageTooBig)},
		},
	)
	for _, code := range []coder.StatusCode{coder.StatusNormalClosure, coder.StatusGoingAway, coder.StatusUnsupportedData,
		coder.StatusPolicyViolation, coder.StatusInternalError, 3000, 4403, 4999} {
		scripts = append(scripts, script{
			name: fmt.Sprintf("the client closes with %d", code),
			run: func(ctx context.Context, c *clientConn) []string {
				// Close returns nil once the server answered with the
				// same code.
				return []string{c.write(ctx, coder.MessageText, []byte("x")), c.read(ctx), errString(c.Close(code, "bye \u20ac"))}
			},
			want: []string{"ok", "text:x", "ok"},
		})
	}
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			for _, peer := range []string{"ours", "coder"} {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				c := dialCoder(ctx, t, urls[peer])
				got := s.run(ctx, c)
				_ = c.CloseNow()
				cancel()
				require.Equal(t, s.want, got, peer)
			}
		})
	}
}

// clientConn is coder/websocket's client with one goroutine reading, as
// its pings need: messages and the read's end come out of a channel.
type clientConn struct {
	*coder.Conn
	msgs chan string
}

func dialCoder(ctx context.Context, t *testing.T, url string) *clientConn {
	t.Helper()
	c, resp, err := coder.Dial(ctx, url, nil)
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	c.SetReadLimit(1 << 20)
	cc := &clientConn{Conn: c, msgs: make(chan string, 16)}
	go func() {
		defer close(cc.msgs)
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				if code := coder.CloseStatus(err); code != -1 {
					cc.msgs <- closed(int(code))
				} else {
					cc.msgs <- dropped
				}
				return
			}
			cc.msgs <- event(strings.ToLower(strings.TrimPrefix(typ.String(), "Message")), b)
		}
	}()
	return cc
}

func (c *clientConn) write(ctx context.Context, typ coder.MessageType, p []byte) string {
	return errString(c.Write(ctx, typ, p))
}

func (c *clientConn) read(ctx context.Context) string {
	select {
	case m, ok := <-c.msgs:
		if !ok {
			return "read after the end"
		}
		return m
	case <-ctx.Done():
		return "nothing to read"
	}
}

func (c *clientConn) ping(ctx context.Context) string {
	if err := c.Ping(ctx); err != nil {
		return err.Error()
	}
	return "pong"
}

func errString(err error) string {
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// TestCoderReadsOurCloseFrames: coder/websocket's client reads the close
// frames server/graphql sends, a reason too long for a control frame cut
// at a rune boundary.
func TestCoderReadsOurCloseFrames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code   int
		reason string
		want   string
	}{
		{CloseNormal, "terminated", "terminated"},
		{CloseProtocolError, "connection initialisation timeout", "connection initialisation timeout"},
		{4403, "Forbidden: " + strings.Repeat("\u20ac", 50), "Forbidden: " + strings.Repeat("\u20ac", 37)},
		{4429, strings.Repeat("r", 200), strings.Repeat("r", 123)},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			nc, _, err := Upgrade(w, r, "")
			if err != nil {
				return
			}
			defer nc.Close()
			_, _ = nc.Write(CloseFrame(c.code, c.reason))
			_, _ = io.Copy(io.Discard, nc) // until the client's close and end
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, resp, err := coder.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
		require.NoError(t, err)
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
		_, _, err = conn.Read(ctx)
		var ce coder.CloseError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, coder.StatusCode(c.code), ce.Code)
		require.Equal(t, c.want, ce.Reason)
		_ = conn.CloseNow()
		cancel()
		srv.Close()
	}
}
