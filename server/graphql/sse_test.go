package graphql_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// sseRaw is an SSE stream read off its socket: no goroutine of its own.
type sseRaw struct {
	conn net.Conn
	resp *http.Response
	body *bufio.Reader
}

// dialSSE posts a subscription over a socket of its own and reads the
// response's head.
func dialSSE(t *testing.T, srvURL, authz, query string, vars map[string]any) *sseRaw {
	t.Helper()
	u, err := url.Parse(srvURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(t, err)
	head := "POST / HTTP/1.1\r\nHost: " + u.Host + "\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n"
	if authz != "" {
		head += "Authorization: " + authz + "\r\n"
	}
	_, err = fmt.Fprintf(conn, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return &sseRaw{conn: conn, resp: resp, body: bufio.NewReader(resp.Body)}
}

// event reads the next event (or comment), blank line included.
func (s *sseRaw) event(t *testing.T) string {
	t.Helper()
	var ev strings.Builder
	for {
		line, err := s.body.ReadString('\n')
		require.NoError(t, err, "after %q", ev.String())
		ev.WriteString(line)
		if line == "\n" {
			return ev.String()
		}
	}
}

// TestSSEAnswersLikeGqlgen: a shared subscription over SSE, served on the
// shared writers once net/http has handed over the connection, answers
// what gqlgen's SSE transport answers for the subscription executed on its
// own: status, headers (but Connection: the stream's connection closes
// after it) and the body byte for byte, values, errors and the complete
// that ends a stream whose token expired.
func TestSSEAnswersLikeGqlgen(t *testing.T) {
	t.Parallel()
	e := setupShared(t)
	e.CreateProduct(t, map[string]any{"sku": "SSEQ-1", "stock": 7})
	docs := []struct {
		name  string
		query string
		vars  map[string]any
	}{
		{"plain", `subscription($s: [ID!]!) { stockChanged(skus: $s) { id sku available held sold total updatedAt } }`,
			map[string]any{"s": []string{"SSEQ-1"}}},
		{"aliases", `subscription Watch($s: [ID!]!) { live: stockChanged(skus: $s) { __typename left: available sku } }`,
			map[string]any{"s": []string{"SSEQ-1"}}},
		{"invalid SKU", `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku } }`,
			map[string]any{"s": []string{"bad sku!"}}},
	}
	for _, d := range docs {
		read := func(srvURL string) (*http.Response, string) {
			tok, err := e.Issuer.Mint("sse-"+strings.ReplaceAll(d.name, " ", "-"), false, 2*time.Second)
			require.NoError(t, err)
			s := dialSSE(t, srvURL, "Bearer "+tok, d.query, d.vars)
			b, err := io.ReadAll(s.resp.Body)
			require.NoError(t, err, d.name)
			return s.resp, string(b)
		}
		wantResp, want := read(e.unshared.URL)
		gotResp, got := read(e.srv.URL)
		require.Equal(t, want, got, d.name)
		require.True(t, strings.HasPrefix(got, ":\n\nevent: next\ndata: {"), "%s: %q", d.name, got)
		require.True(t, strings.HasSuffix(got, "\n\nevent: complete\n\n"), "%s: %q", d.name, got)
		require.Equal(t, wantResp.StatusCode, gotResp.StatusCode)
		require.Equal(t, wantResp.TransferEncoding, gotResp.TransferEncoding)
		require.Equal(t, "keep-alive", wantResp.Header.Get("Connection"))
		require.True(t, gotResp.Close, "the stream's connection closes after it")
		for _, h := range []http.Header{wantResp.Header, gotResp.Header} {
			h.Del("Date")
			h.Del("Connection")
			h.Del("X-Request-Id")
		}
		require.Equal(t, wantResp.Header, gotResp.Header, d.name)
	}
}

// TestIdleSSESubscribersHoldOneGoroutineEach: an idle SSE subscriber of a
// shared subscription costs the server one goroutine (its handler, waiting
// for the client to go): net/http's reader of the connection and the
// keep-alive ticker are gone, and its writes and keep-alives are shared.
// The clients are raw sockets, so every goroutine counted is the server's.
func TestIdleSSESubscribersHoldOneGoroutineEach(t *testing.T) {
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ConnsPerIP = 1000
		c.Streams.PingInterval = 200 * time.Millisecond
	})
	e.CreateProduct(t, map[string]any{"sku": "IDLE-SSE", "stock": 5})
	const n = 200
	vars := map[string]any{"s": []string{"IDLE-SSE"}}
	settle := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	subscribe := func() *sseRaw {
		s := dialSSE(t, e.srv.URL, "", stockSub, vars)
		require.Equal(t, http.StatusOK, s.resp.StatusCode)
		require.Equal(t, ":\n\n", s.event(t))
		require.Contains(t, s.event(t), "event: next\ndata: ")
		return s
	}
	warm := subscribe()
	before := settle()
	for range n {
		subscribe()
	}
	after := settle()
	t.Logf("%d idle SSE subscribers: goroutines %d -> %d (%.2f each)", n, before, after, float64(after-before)/n)
	require.LessOrEqual(t, after-before, n+4, "more than one goroutine per idle SSE subscriber")
	// The shared ticker keeps the streams alive.
	require.Equal(t, ": ping\n\n", warm.event(t))
}
