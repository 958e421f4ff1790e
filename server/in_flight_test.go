package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server"
)

// A body that has not arrived BodyTimeout after the headers is cut off:
// the handler's read fails with os.ErrDeadlineExceeded and the connection
// closes. A body that arrived lifts the bound: a handler answering after
// it, or a stream, is not cut.
func TestSlowBodiesAreCutOff(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	readErr := make(chan error, 1)
	b := setup(t, func(c *server.Config) {
		c.BodyTimeout = timeout
		c.GraphQL = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			if err != nil {
				readErr <- err
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			time.Sleep(3 * timeout) // a slow answer after the body is not cut
			_, _ = io.WriteString(w, "answered")
		})
	})
	addr := strings.TrimPrefix(b.url, "http://")

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /graphql HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	require.NoError(t, err)
	start := time.Now()
	go func() { // a byte now and then, as a slowloris body does
		for range 20 {
			time.Sleep(timeout / 4)
			if _, err := io.WriteString(conn, " "); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // never wait without end
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.ErrorIs(t, <-readErr, os.ErrDeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	// Closed: EOF, or a reset when the trickle's last bytes were unread.
	var ne net.Error
	require.Error(t, err, "the connection is closed")
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is closed, not idle: %v", err)

	r, body := b.do(t, http.MethodPost, "/graphql", strings.NewReader(`{"query":"{ x }"}`), nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	require.Equal(t, "answered", body, "an answer later than the bound, after the body, is not cut")
}

// At most RequestsPerAddr requests of one client address are in flight;
// one more is answered 429 at once, without its body being read, while
// another address and websocket upgrades are still served; a finished
// request gives its slot back.
func TestRequestsInFlightPerAddress(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	b := setup(t, func(c *server.Config) {
		c.RequestsPerAddr = 2
		c.GraphQL = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			if r.Header.Get("X-Hold") != "" {
				<-release
			}
			_, _ = io.WriteString(w, "ok")
		})
	})
	addr := strings.TrimPrefix(b.url, "http://")
	// from sends one request from a loopback address of its own and returns
	// its connection and reader.
	from := func(ip, extra string) (net.Conn, *bufio.Reader) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		conn, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = fmt.Fprintf(conn, "POST /graphql HTTP/1.1\r\nHost: x\r\n%sContent-Length: 2\r\n\r\n{}", extra)
		require.NoError(t, err)
		return conn, bufio.NewReader(conn)
	}
	status := func(r *bufio.Reader) int {
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	_, held1 := from("127.0.0.5", "X-Hold: 1\r\n")
	_, held2 := from("127.0.0.5", "X-Hold: 1\r\n")
	<-entered
	<-entered
	_, over := from("127.0.0.5", "")
	resp, err := http.ReadResponse(over, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	_ = resp.Body.Close()

	_, other := from("127.0.0.6", "")
	require.Equal(t, http.StatusOK, status(other), "another address has slots of its own")
	<-entered
	_, upgrade := from("127.0.0.5", "Upgrade: websocket\r\n")
	require.Equal(t, http.StatusOK, status(upgrade), "a websocket upgrade is not counted")
	<-entered
	_, sse := from("127.0.0.5", "Accept: text/event-stream\r\n")
	require.Equal(t, http.StatusOK, status(sse), "an SSE stream is not counted")
	<-entered

	close(release)
	require.Equal(t, http.StatusOK, status(held1))
	require.Equal(t, http.StatusOK, status(held2))
	require.Eventually(t, func() bool {
		_, again := from("127.0.0.5", "")
		code := status(again)
		if code == http.StatusOK {
			<-entered
		}
		return code == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond, "the slots were given back")
}
